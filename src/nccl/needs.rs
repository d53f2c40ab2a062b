//! What NCCL settings need from the image's operating system. NCCL's IB transport (InfiniBand
//! and RoCE) does not link libibverbs: it dlopens `libibverbs.so.1` when a communicator is
//! made (src/misc/ibvsymbols.cc), and libibverbs loads the NIC's provider (libmlx5 for
//! ConnectX). When either is missing NCCL logs one INFO line and carries on over TCP sockets,
//! so an image set up for IB that lacks them is slow, not broken, and nothing fails.
//!
//! Nothing here reads an image: the callers check the needs against what they can see (the
//! recipe's `system:` list, a base's packages and loader, the running container).

/// A shared library the image must hold, with the Debian and Ubuntu package that ships it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Library {
    /// The name the loader is asked for.
    pub soname: &'static str,
    /// What it is for, in a few words.
    pub role: &'static str,
    /// The Debian and Ubuntu package that installs it (the same name in both).
    pub package: &'static str,
}

/// The libraries NCCL's IB transport needs: the verbs library it opens and the ConnectX
/// provider the verbs library opens in turn (`ibverbs-providers` also carries EFA's, mana's
/// and the other vendors').
pub const IB_LIBRARIES: &[Library] = &[
    Library {
        soname: "libibverbs.so.1",
        role: "the verbs library NCCL's IB transport opens",
        package: "libibverbs1",
    },
    Library {
        soname: "libmlx5.so.1",
        role: "the ConnectX provider libibverbs opens",
        package: "ibverbs-providers",
    },
];

/// What a set of NCCL settings needs from the OS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    /// The settings that ask for it, as the warning names them (`NCCL_IB_HCA, NCCL_IB_TC` or
    /// `NCCL_NET=IB`).
    pub because: String,
    /// The libraries that must load.
    pub libraries: &'static [Library],
}

impl Need {
    /// The packages that install the libraries `has` says are missing, in the table's order.
    pub fn missing_packages(&self, has: impl Fn(&Library) -> bool) -> Vec<&'static str> {
        self.libraries
            .iter()
            .filter(|l| !has(l))
            .map(|l| l.package)
            .collect()
    }

    /// The warning for an image whose OS lacks `missing` (package names, from
    /// `missing_packages`); None when nothing is missing.
    pub fn warning(&self, missing: &[&str]) -> Option<String> {
        if missing.is_empty() {
            return None;
        }
        Some(format!(
            "the image sets {} for NCCL's IB transport, which loads libibverbs.so.1 and the \
             NIC's provider (libmlx5.so.1 for ConnectX), but neither the base nor `system:` \
             installs {}: NCCL would run across nodes over TCP sockets; add `system: [{}]`",
            self.because,
            missing.join(" or "),
            missing.join(", ")
        ))
    }

    /// The warning for a recipe whose `system:` installs nothing, read without its base: the
    /// base may have the libraries, so it says how to check.
    pub fn warning_unread_base(&self) -> String {
        let packages: Vec<&str> = self.libraries.iter().map(|l| l.package).collect();
        format!(
            "the recipe sets {} for NCCL's IB transport, which loads libibverbs.so.1 and the \
             NIC's provider (libmlx5.so.1 for ConnectX), and `system:` installs nothing: \
             unless the base has {}, NCCL would run across nodes over TCP sockets; add \
             `system: [{}]` (`build` and `resolve --from BASE` check the base)",
            self.because,
            packages.join(" and "),
            packages.join(", ")
        )
    }
}

/// What `env` (NCCL variable names and values, as the image sets them) needs from the OS:
/// the IB transport's libraries when a setting configures that transport (any `NCCL_IB_*`
/// but `NCCL_IB_DISABLE`, or `NCCL_NET=IB`) and `NCCL_IB_DISABLE=1` does not turn it off.
pub fn of(env: &[(String, String)]) -> Option<Need> {
    of_node(env, &[])
}

/// As [`of`], on a node whose RDMA devices are `devices` (the names under
/// /sys/class/infiniband): NCCL tries its IB transport first wherever it is not turned off,
/// so a node with a device needs the libraries whatever the settings say.
pub fn of_node(env: &[(String, String)], devices: &[String]) -> Option<Need> {
    let value = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    // NCCL reads NCCL_IB_DISABLE with strtoll; any non-zero value turns the transport off.
    if value("NCCL_IB_DISABLE").is_some_and(|v| super::value::strtoll(v).value != 0) {
        return None;
    }
    let mut settings: Vec<&str> = env
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.starts_with("NCCL_IB_") && *n != "NCCL_IB_DISABLE")
        .collect();
    settings.dedup();
    let net_ib = value("NCCL_NET").is_some_and(|v| v.eq_ignore_ascii_case("IB"));
    if net_ib {
        settings.insert(0, "NCCL_NET=IB");
    }
    let because = match (settings.is_empty(), devices.is_empty()) {
        (true, true) => return None,
        (false, _) => settings.join(", "),
        (true, false) => format!("nothing, but the node has {}", devices.join(", ")),
    };
    Some(Need {
        because,
        libraries: IB_LIBRARIES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_way_of_asking_for_ib_and_of_turning_it_off() {
        // Nothing about IB, or only the switch that leaves it at its default.
        assert_eq!(of(&[]), None);
        assert_eq!(of(&env(&[("NCCL_SOCKET_IFNAME", "eth0")])), None);
        assert_eq!(of(&env(&[("NCCL_IB_DISABLE", "0")])), None);
        assert_eq!(of(&env(&[("NCCL_NET", "Socket")])), None);
        // A setting of the transport, NCCL_NET=IB in any case, or both.
        let need = of(&env(&[("NCCL_IB_HCA", "mlx5_0"), ("NCCL_IB_TC", "106")])).unwrap();
        assert_eq!(need.because, "NCCL_IB_HCA, NCCL_IB_TC");
        assert_eq!(
            of(&env(&[("NCCL_NET", "ib")])).unwrap().because,
            "NCCL_NET=IB"
        );
        let both = of(&env(&[("NCCL_IB_TIMEOUT", "22"), ("NCCL_NET", "IB")])).unwrap();
        assert_eq!(both.because, "NCCL_NET=IB, NCCL_IB_TIMEOUT");
        // NCCL_IB_DISABLE with any non-zero integer wins over every setting.
        for off in ["1", "2", " 1", "0x1", "1abc"] {
            let e = env(&[
                ("NCCL_IB_HCA", "mlx5_0"),
                ("NCCL_NET", "IB"),
                ("NCCL_IB_DISABLE", off),
            ]);
            assert_eq!(of(&e), None, "NCCL_IB_DISABLE={off:?}");
        }
        // A value strtoll reads as 0 does not turn it off; the last one set wins.
        for on in ["yes", "true", "00"] {
            let e = env(&[("NCCL_IB_HCA", "mlx5_0"), ("NCCL_IB_DISABLE", on)]);
            assert!(of(&e).is_some(), "NCCL_IB_DISABLE={on:?}");
        }
        let later = env(&[("NCCL_NET", "IB"), ("NCCL_NET", "Socket")]);
        assert_eq!(of(&later), None);
    }

    #[test]
    fn a_node_with_an_rdma_device_needs_the_libraries_unless_ib_is_off() {
        let devices = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
        let need = of_node(&[], &devices).unwrap();
        assert_eq!(need.because, "nothing, but the node has mlx5_0, mlx5_1");
        // The settings are named first when there are any.
        let set = env(&[("NCCL_IB_HCA", "mlx5_0")]);
        assert_eq!(of_node(&set, &devices).unwrap().because, "NCCL_IB_HCA");
        assert_eq!(of_node(&env(&[("NCCL_IB_DISABLE", "1")]), &devices), None);
        assert_eq!(of_node(&[], &[]), None);
    }

    #[test]
    fn the_warning_names_only_what_is_missing() {
        let need = of(&env(&[("NCCL_IB_HCA", "mlx5_0")])).unwrap();
        assert_eq!(need.missing_packages(|_| true), Vec::<&str>::new());
        assert_eq!(need.warning(&[]), None);
        let missing = need.missing_packages(|l| l.soname == "libibverbs.so.1");
        assert_eq!(missing, ["ibverbs-providers"]);
        let text = need.warning(&missing).unwrap();
        assert!(text.contains("sets NCCL_IB_HCA"), "{text}");
        assert!(
            text.ends_with("add `system: [ibverbs-providers]`"),
            "{text}"
        );
        let all = need.missing_packages(|_| false);
        assert_eq!(all, ["libibverbs1", "ibverbs-providers"]);
        assert!(
            need.warning(&all)
                .unwrap()
                .contains("installs libibverbs1 or ibverbs-providers")
        );
    }
}
