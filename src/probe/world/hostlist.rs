//! Slurm's compressed host lists (`node[01-03,07],gpu-a[1-2]`), expanded without `scontrol`,
//! which a container seldom has. A range keeps the zero padding of its lower bound, as Slurm
//! writes it: `[08-10]` is 08, 09, 10. Several bracket groups in one name multiply out.

/// More names than any cluster has: a guard against a typo like `n[0-999999999]`.
const MOST_HOSTS: usize = 100_000;

/// Every host in `list`, in order; Err says what is malformed.
pub fn expand(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for part in split_top_level(list)? {
        if part.is_empty() {
            return Err(format!("an empty host name in `{list}`"));
        }
        for host in expand_one(part)? {
            hosts.push(host);
            if hosts.len() > MOST_HOSTS {
                return Err(format!("`{list}` names more than {MOST_HOSTS} hosts"));
            }
        }
    }
    if hosts.is_empty() {
        return Err("the list is empty".into());
    }
    Ok(hosts)
}

/// Splits at the commas outside brackets: those inside separate ranges, not hosts.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("nested brackets in `{list}`")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("a `]` without its `[` in `{list}`")),
            ',' if depth == 0 => {
                parts.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("a `[` without its `]` in `{list}`"));
    }
    parts.push(list[start..].trim());
    Ok(parts)
}

/// One name with any number of bracket groups: `rack[1-2]-n[01-02]` is four hosts.
fn expand_one(name: &str) -> Result<Vec<String>, String> {
    let Some(open) = name.find('[') else {
        return Ok(vec![name.to_string()]);
    };
    // split_top_level has checked that every `[` is closed.
    let close = open + name[open..].find(']').ok_or("unclosed bracket")?;
    let prefix = &name[..open];
    let numbers = numbers_in(&name[open + 1..close]).map_err(|e| format!("`{name}`: {e}"))?;
    let rests = expand_one(&name[close + 1..])?;
    let mut hosts = Vec::new();
    for number in &numbers {
        for rest in &rests {
            hosts.push(format!("{prefix}{number}{rest}"));
            if hosts.len() > MOST_HOSTS {
                return Err(format!("`{name}` names more than {MOST_HOSTS} hosts"));
            }
        }
    }
    Ok(hosts)
}

/// `01-03,07` as `["01", "02", "03", "07"]`.
fn numbers_in(ranges: &str) -> Result<Vec<String>, String> {
    let mut numbers = Vec::new();
    for range in ranges.split(',') {
        let range = range.trim();
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        let parse = |text: &str| -> Result<u64, String> {
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("`{range}` is not a number or a range of numbers"));
            }
            text.parse()
                .map_err(|_| format!("`{text}` is too large a number"))
        };
        let (from, to) = (parse(low)?, parse(high)?);
        if to < from {
            return Err(format!("the range `{range}` runs backwards"));
        }
        if to - from >= MOST_HOSTS as u64 {
            return Err(format!(
                "the range `{range}` names more than {MOST_HOSTS} hosts"
            ));
        }
        let width = low.len();
        numbers.extend((from..=to).map(|n| format!("{n:0width$}")));
    }
    Ok(numbers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn ranges_keep_the_zero_padding_of_their_lower_bound() {
        assert_eq!(
            hosts("node[01-03,07],gpu-a[1-2]"),
            ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]
        );
        assert_eq!(hosts("dev[8-10]"), ["dev8", "dev9", "dev10"]);
        assert_eq!(hosts("dev[08-10]"), ["dev08", "dev09", "dev10"]);
        assert_eq!(hosts("n[098-100]"), ["n098", "n099", "n100"]);
    }

    #[test]
    fn plain_names_and_several_groups() {
        assert_eq!(hosts("solo"), ["solo"]);
        assert_eq!(hosts("a, b"), ["a", "b"]);
        assert_eq!(
            hosts("rack[1-2]-n[01-02]"),
            ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
        );
        assert_eq!(hosts("gpu[3]"), ["gpu3"]);
        assert_eq!(hosts("x[1-2]y"), ["x1y", "x2y"]);
    }

    #[test]
    fn malformed_lists_say_what_is_wrong() {
        for (list, says) in [
            ("node[01-03", "without its `]`"),
            ("node01]", "without its `[`"),
            ("node[[1]]", "nested"),
            ("node[3-1]", "backwards"),
            ("node[a-b]", "not a number"),
            ("node[1-]", "not a number"),
            ("node[]", "not a number"),
            ("a,,b", "empty host name"),
            ("", "empty host name"),
            ("n[0-999999999]", "more than"),
            ("n[0-300],m[0-99999]", "more than"),
            ("n[99999999999999999999]", "too large"),
        ] {
            let err = expand(list).unwrap_err();
            assert!(err.contains(says), "{list}: {err}");
        }
    }
}
