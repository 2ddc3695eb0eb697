//! Time formats of the sources: nvidia-smi's and gridd's `Y-M-D H:M:S GMT` (no zero padding),
//! and RFC 3339 for the report, with the report's time types and how they are written.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, SubsecRound, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The moment, as the pure deciders are given it: monotonic time since the service started
/// (what waits are counted in), and the wall clock (what is written).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Now {
    pub mono: Duration,
    pub wall: DateTime<Utc>,
}

/// RFC 3339 in UTC with a `Z`, to the second.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The instant to the second, as the report keeps it: two readings within the same second
/// are the same time, as their text is.
pub fn whole_secs(t: DateTime<Utc>) -> DateTime<Utc> {
    t.trunc_subsecs(0)
}

/// Reads what [`rfc3339`] writes (any RFC 3339 offset is taken, as UTC).
fn parse_rfc3339(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s).ok().map(|t| t.to_utc())
}

/// The report's instants: written as [`rfc3339`] writes them (`2024-09-15T17:16:29Z`).
pub mod rfc3339_secs {
    use super::*;

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&rfc3339(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = String::deserialize(d)?;
        parse_rfc3339(&s).ok_or_else(|| serde::de::Error::custom("not an RFC 3339 time"))
    }

    /// The same for an instant that may be unknown (`null`).
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(
            t: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => super::serialize(t, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            #[derive(Deserialize)]
            struct Wrap(#[serde(with = "super")] DateTime<Utc>);
            Ok(Option::<Wrap>::deserialize(d)?.map(|Wrap(t)| t))
        }
    }
}

/// When a log line was written, as precisely as the log said: an instant where it gave the
/// zone, else the local wall-clock time (syslog text that does not say its zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTime {
    /// Written as [`rfc3339`] writes it: `2024-09-15T17:16:29Z`.
    Utc(DateTime<Utc>),
    /// Written without an offset: `2024-09-16T01:16:29`.
    Local(NaiveDateTime),
}

const LOCAL_FORMAT: &str = "%Y-%m-%dT%H:%M:%S";

impl fmt::Display for LogTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogTime::Utc(t) => f.write_str(&rfc3339(*t)),
            LogTime::Local(n) => write!(f, "{}", n.format(LOCAL_FORMAT)),
        }
    }
}

impl LogTime {
    /// Reads what [`LogTime`]'s `Display` writes: with an offset an instant, without one a
    /// wall-clock time.
    fn parse(s: &str) -> Option<LogTime> {
        parse_rfc3339(s).map(LogTime::Utc).or_else(|| {
            NaiveDateTime::parse_from_str(s, &format!("{LOCAL_FORMAT}%.f"))
                .ok()
                .map(LogTime::Local)
        })
    }
}

impl Serialize for LogTime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LogTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LogTime, D::Error> {
        let s = String::deserialize(d)?;
        LogTime::parse(&s).ok_or_else(|| serde::de::Error::custom("not a log time"))
    }
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

    #[test]
    fn report_times_are_written_to_the_second() {
        let t = DateTime::parse_from_rfc3339("2024-09-16T01:16:29.75+08:00")
            .unwrap()
            .to_utc();
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct R(#[serde(with = "rfc3339_secs::option")] Option<DateTime<Utc>>);
        let json = serde_json::to_string(&R(Some(whole_secs(t)))).unwrap();
        assert_eq!(json, r#""2024-09-15T17:16:29Z""#);
        assert_eq!(
            serde_json::from_str::<R>(&json).unwrap(),
            R(Some(whole_secs(t)))
        );
        assert_eq!(serde_json::to_string(&R(None)).unwrap(), "null");
        assert_eq!(serde_json::from_str::<R>("null").unwrap(), R(None));
        let local = LogTime::parse("2024-09-16T01:16:29").unwrap();
        assert!(matches!(local, LogTime::Local(_)));
        assert_eq!(
            serde_json::to_string(&local).unwrap(),
            r#""2024-09-16T01:16:29""#
        );
        assert_eq!(LogTime::parse("Sep 16 01:16:29"), None);
    }
}
