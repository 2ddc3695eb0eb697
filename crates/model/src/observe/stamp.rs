//! When a gridd line was logged, as precisely as the line says: the time model of gridd's
//! logs (syslog text has no year and often no zone; journald's entries are exact) and the
//! parser of every timestamp style the samples show.

use chrono::{DateTime, NaiveDate, Utc};

use crate::time::LogTime;

/// When a line was logged, as precisely as the line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Syslog text has no year: `None` unless the context gave one.
    pub year: Option<i32>,
    pub month: u32,
    pub day: u32,
    /// Seconds since midnight.
    pub secs: u32,
    /// Seconds east of UTC, when the line or its context said the zone.
    pub offset: Option<i32>,
}

impl Stamp {
    /// The stamp of an exact instant.
    pub fn from_utc(t: DateTime<Utc>) -> Stamp {
        use chrono::{Datelike, Timelike};
        Stamp {
            year: Some(t.year()),
            month: t.month(),
            day: t.day(),
            secs: t.num_seconds_from_midnight(),
            offset: Some(0),
        }
    }

    /// A position within a year (not exact days; only for ordering and short distances).
    pub fn ord(&self) -> i64 {
        (i64::from(self.month) * 32 + i64::from(self.day)) * 86400 + i64::from(self.secs)
    }

    fn naive(&self) -> Option<chrono::NaiveDateTime> {
        NaiveDate::from_ymd_opt(self.year?, self.month, self.day)?.and_hms_opt(
            self.secs / 3600,
            self.secs / 60 % 60,
            self.secs % 60,
        )
    }

    /// The exact instant, when year and zone are known.
    pub fn utc(&self) -> Option<DateTime<Utc>> {
        let n = self.naive()?;
        Some(n.and_utc() - chrono::Duration::seconds(i64::from(self.offset?)))
    }

    /// The wall-clock time read as UTC, when the year is known (good for hours, not exact).
    pub fn naive_as_utc(&self) -> Option<DateTime<Utc>> {
        self.naive().map(|n| n.and_utc())
    }

    /// For the report: the instant when year and zone are known, the local wall-clock time
    /// when only the zone is unknown, `None` without a year.
    pub fn at(&self) -> Option<LogTime> {
        match self.utc() {
            Some(t) => Some(LogTime::Utc(t)),
            None => self.naive().map(LogTime::Local),
        }
    }
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

fn month_of(s: &str) -> Option<u32> {
    let s = s.get(..3)?.to_ascii_lowercase();
    MONTHS.iter().position(|m| *m == s).map(|i| i as u32 + 1)
}

fn is_weekday(s: &str) -> bool {
    s.len() == 3 && WEEKDAYS.contains(&s.to_ascii_lowercase().as_str())
}

/// `HH:MM:SS[.frac]` -> seconds of the day.
fn parse_hms(s: &str) -> Option<u32> {
    let s = s.split('.').next()?;
    let mut it = s.split(':');
    let h: u32 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let sec: u32 = it.next()?.parse().ok()?;
    (it.next().is_none() && h < 24 && m < 60 && sec < 61).then_some(h * 3600 + m * 60 + sec)
}

/// `+0800`, `+08:00`, `-05`, `Z`, `UTC`, `GMT` -> seconds east of UTC.
fn parse_zone(s: &str) -> Option<i32> {
    match s {
        "Z" | "UTC" | "GMT" => return Some(0),
        _ => {}
    }
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => return None,
    };
    let digits: String = rest.chars().filter(|c| *c != ':').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) || !matches!(digits.len(), 2 | 4) {
        return None;
    }
    let h: i32 = digits[..2].parse().ok()?;
    let m: i32 = digits.get(2..).map_or(Some(0), |m| m.parse().ok())?;
    Some(sign * (h * 3600 + m * 60))
}

/// `YYYY-MM-DD` -> (year, month, day).
fn parse_ymd(s: &str) -> Option<(i32, u32, u32)> {
    let mut it = s.split('-');
    let y = it.next().filter(|y| y.len() == 4)?.parse().ok()?;
    let m = it.next()?.parse().ok()?;
    let d = it.next()?.parse().ok()?;
    (it.next().is_none() && NaiveDate::from_ymd_opt(y, m, d).is_some()).then_some((y, m, d))
}

/// Splits off the first whitespace-separated word.
fn word(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    if s.is_empty() {
        return None;
    }
    Some(s.split_once(char::is_whitespace).unwrap_or((s, "")))
}

/// A leading timestamp in any of journalctl's text styles; returns it and the rest.
pub(crate) fn parse_stamp(s: &str) -> Option<(Stamp, &str)> {
    let (w1, rest) = word(s)?;
    // short-iso / short-iso-precise: 2024-09-16T01:16:29+0800
    if let Some((date, time)) = w1.split_once('T')
        && let Some(ymd) = parse_ymd(date)
    {
        return Some((iso_stamp(ymd, time)?, rest));
    }
    // short-full: Mon 2024-09-16 01:16:29 CST
    if is_weekday(w1)
        && let Some((w2, rest2)) = word(rest)
        && let Some(ymd) = parse_ymd(w2)
    {
        return full_stamp(ymd, rest2);
    }
    short_stamp(w1, rest)
}

/// short-iso's time and zone (`01:16:29+0800`), the date read.
fn iso_stamp((y, month, day): (i32, u32, u32), time: &str) -> Option<Stamp> {
    let zone_at = time.find(['+', '-', 'Z']).unwrap_or(time.len());
    let secs = parse_hms(&time[..zone_at])?;
    let offset = if zone_at < time.len() {
        Some(parse_zone(&time[zone_at..])?)
    } else {
        None
    };
    Some(Stamp {
        year: Some(y),
        month,
        day,
        secs,
        offset,
    })
}

/// short-full's time and zone (`01:16:29 CST`), the weekday and date read.
fn full_stamp((y, month, day): (i32, u32, u32), rest: &str) -> Option<(Stamp, &str)> {
    let (w3, rest3) = word(rest)?;
    let secs = parse_hms(w3)?;
    let (offset, rest4) = match word(rest3) {
        Some((z, r)) if z.chars().all(|c| c.is_ascii_uppercase()) && z.len() <= 5 => {
            (parse_zone(z), r)
        }
        Some((z, r)) if parse_zone(z).is_some() => (parse_zone(z), r),
        _ => (None, rest3),
    };
    let st = Stamp {
        year: Some(y),
        month,
        day,
        secs,
        offset,
    };
    Some((st, rest4))
}

/// short / short-precise (`Sep 16 01:16:29[.123456]`), and a Windows container log's
/// `Tue Dec 20 17:25:11 2022:<1>:msg`.
fn short_stamp<'a>(w1: &'a str, rest: &'a str) -> Option<(Stamp, &'a str)> {
    let (w1, rest) = if is_weekday(w1) {
        word(rest)?
    } else {
        (w1, rest)
    };
    let month = month_of(w1).filter(|_| w1.len() == 3)?;
    let (dw, rest) = word(rest)?;
    let day: u32 = dw.parse().ok().filter(|d| (1..=31).contains(d))?;
    let (tw, rest) = word(rest)?;
    let secs = parse_hms(tw)?;
    // "17:25:11 2022:<1>:msg" (Windows) carries a year.
    let (year, rest) = match rest.trim_start().get(..5) {
        Some(y) if y.ends_with(':') && y[..4].bytes().all(|b| b.is_ascii_digit()) => {
            (y[..4].parse().ok(), &rest.trim_start()[5..])
        }
        _ => (None, rest),
    };
    let st = Stamp {
        year,
        month,
        day,
        secs,
        offset: None,
    };
    Some((st, rest))
}
