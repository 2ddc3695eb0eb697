//! The fields of one `journalctl -o json` entry that the log parser reads, taken without
//! building the whole entry: the other fields are skipped, and strings stay in the line.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A field's value as journald writes it: a string, bytes (an array of numbers, for a value
/// that is not UTF-8), or something else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field<'a> {
    Str(Cow<'a, str>),
    Bytes(Vec<u8>),
    Other,
}

impl Field<'_> {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Field::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The fields read; each is `None` where the entry does not have it. Where a field is given
/// twice, the last one counts.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fields<'a> {
    pub realtime: Option<Field<'a>>,
    pub uid: Option<Field<'a>>,
    pub comm: Option<Field<'a>>,
    pub exe: Option<Field<'a>>,
    pub unit: Option<Field<'a>>,
    pub syslog_identifier: Option<Field<'a>>,
    pub message: Option<Field<'a>>,
    pub pid: Option<Field<'a>>,
    pub syslog_pid: Option<Field<'a>>,
}

/// The fields of a line that is one JSON object; `None` for anything else.
pub fn read(line: &[u8]) -> Option<Fields<'_>> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let fields = de.deserialize_map(FieldsVisitor).ok()?;
    de.end().ok()?;
    Some(fields)
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a journal entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
        let mut fields = Fields::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let slot = match key {
                Key::Realtime => &mut fields.realtime,
                Key::Uid => &mut fields.uid,
                Key::Comm => &mut fields.comm,
                Key::Exe => &mut fields.exe,
                Key::Unit => &mut fields.unit,
                Key::SyslogIdentifier => &mut fields.syslog_identifier,
                Key::Message => &mut fields.message,
                Key::Pid => &mut fields.pid,
                Key::SyslogPid => &mut fields.syslog_pid,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value_seed(FieldSeed)?);
        }
        Ok(fields)
    }
}

enum Key {
    Realtime,
    Uid,
    Comm,
    Exe,
    Unit,
    SyslogIdentifier,
    Message,
    Pid,
    SyslogPid,
    Other,
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        // As bytes: the names are compared, never checked as UTF-8 (most are skipped).
        d.deserialize_bytes(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_bytes<E: de::Error>(self, key: &[u8]) -> Result<Key, E> {
        Ok(match key {
            b"__REALTIME_TIMESTAMP" => Key::Realtime,
            b"_UID" => Key::Uid,
            b"_COMM" => Key::Comm,
            b"_EXE" => Key::Exe,
            b"_SYSTEMD_UNIT" => Key::Unit,
            b"SYSLOG_IDENTIFIER" => Key::SyslogIdentifier,
            b"MESSAGE" => Key::Message,
            b"_PID" => Key::Pid,
            b"SYSLOG_PID" => Key::SyslogPid,
            _ => Key::Other,
        })
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        self.visit_bytes(key.as_bytes())
    }
}

struct FieldSeed;

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = Field<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Field<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed {
    type Value = Field<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field's value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Owned(v.to_owned())))
    }

    /// Bytes: the numbers of the array that are bytes, in order (anything else in it is
    /// left out).
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Field<'de>, A::Error> {
        let mut bytes = Vec::new();
        while let Some(b) = seq.next_element::<MaybeByte>()? {
            bytes.extend(b.0);
        }
        Ok(Field::Bytes(bytes))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
}

/// One element of a bytes array: the byte, or nothing where it is not a number from 0 to 255.
struct MaybeByte(Option<u8>);

impl<'de> de::Deserialize<'de> for MaybeByte {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MaybeByteVisitor)
    }
}

struct MaybeByteVisitor;

impl<'de> Visitor<'de> for MaybeByteVisitor {
    type Value = MaybeByte;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a byte")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<MaybeByte, E> {
        Ok(MaybeByte(u8::try_from(v).ok()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<MaybeByte, E> {
        Ok(MaybeByte(u8::try_from(v).ok()))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<MaybeByte, E> {
        Ok(MaybeByte(None))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<MaybeByte, E> {
        Ok(MaybeByte(None))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<MaybeByte, E> {
        Ok(MaybeByte(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<MaybeByte, E> {
        Ok(MaybeByte(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MaybeByte, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(MaybeByte(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MaybeByte, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(MaybeByte(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// What the same line gives when read whole, as the fields above.
    fn by_value(line: &str) -> Option<Fields<'static>> {
        let v: Value = serde_json::from_str(line).ok()?;
        let map = v.as_object()?;
        let field = |k: &str| {
            map.get(k).map(|v| match v {
                Value::String(s) => Field::Str(Cow::Owned(s.clone())),
                Value::Array(a) => Field::Bytes(
                    a.iter()
                        .filter_map(|n| n.as_u64().and_then(|n| u8::try_from(n).ok()))
                        .collect(),
                ),
                _ => Field::Other,
            })
        };
        Some(Fields {
            realtime: field("__REALTIME_TIMESTAMP"),
            uid: field("_UID"),
            comm: field("_COMM"),
            exe: field("_EXE"),
            unit: field("_SYSTEMD_UNIT"),
            syslog_identifier: field("SYSLOG_IDENTIFIER"),
            message: field("MESSAGE"),
            pid: field("_PID"),
            syslog_pid: field("SYSLOG_PID"),
        })
    }

    #[test]
    fn reads_what_the_whole_entry_holds() {
        for line in [
            r#"{"__REALTIME_TIMESTAMP":"1726420589000000","_COMM":"nvidia-gridd","_PID":"3239","_UID":"0","MESSAGE":"NLS initialized","_BOOT_ID":"x","_X":{"a":[1,2]}}"#,
            r#"{"SYSLOG_IDENTIFIER":"nvidia-gridd","MESSAGE":[83,116,97,300,-1,"x",null,[1],{"a":1},1.5,41]}"#,
            r#"{"_UID":0,"_COMM":null,"_EXE":true,"_SYSTEMD_UNIT":{"x":"y"},"MESSAGE":"a\"b\u00e9\n"}"#,
            r#"{"MESSAGE":"first","MESSAGE":"second"}"#,
            r#"  { "_PID" : "12" , "SYSLOG_PID":"13" }  "#,
            r#"{}"#,
        ] {
            assert_eq!(read(line.as_bytes()), by_value(line), "{line}");
            assert!(read(line.as_bytes()).is_some(), "{line}");
        }
    }

    #[test]
    fn a_line_that_is_not_one_object_is_not_read() {
        for line in [r#"{"a":1} x"#, r#"{"a":"#, r#"[1,2]"#, "text", r#""s""#, ""] {
            assert_eq!(read(line.as_bytes()), None, "{line}");
        }
    }
}
