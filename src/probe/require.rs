//! `NVIDIA_REQUIRE_*` as nvidia-container-toolkit reads it: whitespace separates
//! alternatives (OR), commas join conditions (AND); a condition compares `cuda`, `driver`,
//! `arch` or `brand` with `=`, `!=`, `<`, `<=`, `>` or `>=`. `cuda` is the CUDA version the
//! driver supports, `driver` the driver version; `arch` and `brand` hold per GPU.

use crate::version::Version;
use std::cmp::Ordering;
use std::fmt;

/// The node a requirement is checked against (one GPU of it for `arch` and `brand`).
#[derive(Clone, Debug)]
pub struct Target {
    /// The CUDA version the driver supports (`13.0`).
    pub cuda: Version,
    /// The driver version (`580.159.03`).
    pub driver: Version,
    /// The GPU's compute capability (`9.0`).
    pub arch: Option<Version>,
    /// The GPU's brand as NVML names it (`nvidia`, `tesla`).
    pub brand: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Debug)]
struct Condition {
    key: String,
    op: Op,
    value: String,
}

/// A parsed requirement.
#[derive(Clone, Debug)]
pub struct Requirement {
    text: String,
    alternatives: Vec<Vec<Condition>>,
}

impl Requirement {
    /// Parses the toolkit's grammar.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut alternatives = Vec::new();
        for alt in text.split_whitespace() {
            let mut conds = Vec::new();
            for cond in alt.split(',').filter(|c| !c.is_empty()) {
                let key_end = cond
                    .find(['=', '!', '<', '>'])
                    .ok_or_else(|| format!("`{cond}` has no operator (=, !=, <, <=, >, >=)"))?;
                let (key, rest) = cond.split_at(key_end);
                let (op, value) = [
                    ("!=", Op::Ne),
                    ("<=", Op::Le),
                    (">=", Op::Ge),
                    ("==", Op::Eq),
                    ("=", Op::Eq),
                    ("<", Op::Lt),
                    (">", Op::Gt),
                ]
                .iter()
                .find_map(|(sym, op)| rest.strip_prefix(sym).map(|v| (*op, v)))
                .ok_or_else(|| format!("`{cond}` has no operator"))?;
                let key = key.to_ascii_lowercase();
                if !["cuda", "driver", "arch", "brand"].contains(&key.as_str()) {
                    return Err(format!(
                        "`{cond}`: `{key}` is not cuda, driver, arch or brand"
                    ));
                }
                if key != "brand" {
                    value
                        .parse::<Version>()
                        .map_err(|e| format!("`{cond}`: {e}"))?;
                } else if !matches!(op, Op::Eq | Op::Ne) {
                    return Err(format!("`{cond}`: brand takes only = or !="));
                }
                conds.push(Condition {
                    key,
                    op,
                    value: value.to_string(),
                });
            }
            alternatives.push(conds);
        }
        Ok(Requirement {
            text: text.to_string(),
            alternatives,
        })
    }

    /// Ok when some alternative holds entirely; otherwise the first failing condition of
    /// each alternative.
    pub fn check(&self, t: &Target) -> Result<(), String> {
        if self.alternatives.is_empty() {
            return Ok(());
        }
        let mut why = Vec::new();
        for alt in &self.alternatives {
            match alt.iter().find(|c| !holds(c, t)) {
                None => return Ok(()),
                Some(c) => why.push(format!(
                    "{}{}{} is false ({})",
                    c.key,
                    op_text(c.op),
                    c.value,
                    actual(c, t)
                )),
            }
        }
        Err(why.join("; and "))
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn op_text(op: Op) -> &'static str {
    match op {
        Op::Eq => "=",
        Op::Ne => "!=",
        Op::Lt => "<",
        Op::Le => "<=",
        Op::Gt => ">",
        Op::Ge => ">=",
    }
}

fn actual(c: &Condition, t: &Target) -> String {
    match c.key.as_str() {
        "cuda" => format!("the driver supports CUDA {}", t.cuda),
        "driver" => format!("the driver is {}", t.driver),
        "arch" => format!(
            "the GPU is {}",
            t.arch
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or("unknown".into())
        ),
        _ => format!("the brand is {}", t.brand.as_deref().unwrap_or("unknown")),
    }
}

fn holds(c: &Condition, t: &Target) -> bool {
    let ord = match c.key.as_str() {
        "cuda" => Some(t.cuda.cmp(&c.value.parse().expect("checked at parse"))),
        "driver" => Some(t.driver.cmp(&c.value.parse().expect("checked at parse"))),
        "arch" => match &t.arch {
            Some(a) => Some(a.cmp(&c.value.parse().expect("checked at parse"))),
            None => return false,
        },
        _ => {
            let same = t
                .brand
                .as_deref()
                .is_some_and(|b| b.eq_ignore_ascii_case(&c.value));
            return if c.op == Op::Eq { same } else { !same };
        }
    };
    let ord = ord.expect("versions compare");
    match c.op {
        Op::Eq => ord == Ordering::Equal,
        Op::Ne => ord != Ordering::Equal,
        Op::Lt => ord == Ordering::Less,
        Op::Le => ord != Ordering::Greater,
        Op::Gt => ord == Ordering::Greater,
        Op::Ge => ord != Ordering::Less,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(cuda: &str, driver: &str) -> Target {
        Target {
            cuda: cuda.parse().unwrap(),
            driver: driver.parse().unwrap(),
            arch: Some("9.0".parse().unwrap()),
            brand: Some("nvidia".into()),
        }
    }

    #[test]
    fn commas_are_and_spaces_are_or() {
        let r = Requirement::parse("cuda>=12.0,driver>=525.60.13").unwrap();
        assert!(r.check(&target("13.0", "580.95.05")).is_ok());
        let err = r.check(&target("12.0", "525.60.11")).unwrap_err();
        assert!(
            err.contains("driver>=525.60.13 is false (the driver is 525.60.11)"),
            "{err}"
        );
        // The CUDA images' pattern: new enough CUDA, or a specific older branch.
        let r = Requirement::parse("cuda>=12.8 brand=tesla,driver>=535,driver<536").unwrap();
        assert!(r.check(&target("12.8", "570.1")).is_ok());
        assert!(
            r.check(&target("12.2", "535.54")).is_err(),
            "brand is nvidia, not tesla"
        );
        let mut tesla = target("12.2", "535.54");
        tesla.brand = Some("Tesla".into());
        assert!(r.check(&tesla).is_ok());
    }

    #[test]
    fn arch_compares_as_a_version() {
        let r = Requirement::parse("arch>=8.0").unwrap();
        assert!(r.check(&target("12.8", "570")).is_ok());
        let mut old = target("12.8", "570");
        old.arch = Some("7.0".parse().unwrap());
        assert!(r.check(&old).is_err());
    }

    #[test]
    fn bad_requirements_are_refused() {
        assert!(Requirement::parse("cuda").is_err());
        assert!(Requirement::parse("gpu>=1").is_err());
        assert!(Requirement::parse("cuda>=abc").is_err());
        assert!(Requirement::parse("brand>nvidia").is_err());
        assert!(
            Requirement::parse("")
                .unwrap()
                .check(&target("1.0", "1"))
                .is_ok()
        );
    }
}
