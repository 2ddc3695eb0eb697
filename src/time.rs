//! Time formats of the sources: nvidia-smi's and gridd's `Y-M-D H:M:S GMT` (no zero padding),
//! and RFC 3339 for the report.

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, Utc};

/// RFC 3339 in UTC with a `Z`, to the second.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Parses `Y-M-D H:M:S` with or without zero padding (`2022-5-27 0:8:28`).
pub fn parse_ymd_hms(s: &str) -> Option<NaiveDateTime> {
    let s = s.trim();
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-').map(|p| p.trim().parse::<u32>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() {
        return None;
    }
    let mut t = time.trim().split(':');
    let h = t.next()?.trim().parse::<u32>().ok()?;
    let mi = t.next()?.trim().parse::<u32>().ok()?;
    let sec = t.next().unwrap_or("0");
    let sec = sec.split('.').next()?.trim().parse::<u32>().ok()?;
    // Four-digit years only: what RFC 3339 can write, and far from chrono's limits.
    if t.next().is_some() || !(1970..=9999).contains(&y) {
        return None;
    }
    NaiveDate::from_ymd_opt(i32::try_from(y).ok()?, mo, da)?.and_hms_opt(h, mi, sec)
}

/// Parses an expiry as nvidia-smi and gridd print it: `2022-5-27 0:8:28 GMT`. The zone, when
/// given, must be GMT or UTC. `N/A`, `Permanent` and anything else give `None`.
pub fn parse_gmt(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim();
    let s = ["GMT", "UTC", "Z"]
        .iter()
        .find_map(|z| s.strip_suffix(z))
        .unwrap_or(s);
    parse_ymd_hms(s).map(|n| n.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_without_zero_padding() {
        let t = parse_gmt("2022-5-27 0:8:28 GMT").unwrap();
        assert_eq!(rfc3339(t), "2022-05-27T00:08:28Z");
        assert_eq!(
            rfc3339(parse_gmt("2023-1-29 22:3:0 GMT").unwrap()),
            "2023-01-29T22:03:00Z"
        );
        assert_eq!(parse_gmt("N/A"), None);
        assert_eq!(parse_gmt("Permanent"), None);
        assert_eq!(parse_gmt("2022-13-1 0:0:0 GMT"), None);
        assert_eq!(parse_gmt("262142-12-31 23:59:59 GMT"), None);
        assert_eq!(parse_gmt("99999-1-1 0:0:0 GMT"), None);
        assert!(parse_gmt("9999-12-31 23:59:59 GMT").is_some());
        assert_eq!(parse_gmt("2022-5-27"), None);
    }
}
