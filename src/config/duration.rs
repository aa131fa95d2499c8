//! The one way a duration is written in sandcell's configuration and messages: read as
//! a number of seconds (`30`, `0.25`) or a string of whole numbers with units (`"250ms"`,
//! `"30s"`, `"15m"`, `"2h"`, `"1d"`, combined as `"1m30s"`); written as seconds.
//!
//! Use it on a field with `#[serde(with = "sandcell::config::duration")]`, or
//! [`option`] for an `Option<Duration>`:
//!
//! ```
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Settings {
//!     #[serde(with = "sandcell::config::duration")]
//!     idle: Duration,
//!     #[serde(default, with = "sandcell::config::duration::option")]
//!     lifetime: Option<Duration>,
//! }
//!
//! let s: Settings = serde_json::from_str(r#"{"idle": "15m", "lifetime": 90}"#).unwrap();
//! assert_eq!(s.idle, Duration::from_secs(900));
//! assert_eq!(s.lifetime, Some(Duration::from_secs(90)));
//! assert_eq!(sandcell::config::duration::parse("1m30s"), Ok(Duration::from_secs(90)));
//! ```

use std::fmt;
use std::time::Duration;

use serde::{Deserializer, Serializer};

/// Parses a duration string: whole numbers each followed by a unit (`ms`, `s`, `m`,
/// `h`, `d`), or a plain number of seconds. The error says what is wrong.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return from_secs(secs);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err("an empty duration".to_owned());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let unit_len = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || unit_len == 0 {
            return Err(format!(
                "{text:?} is not a duration (write seconds, or e.g. \"250ms\", \"30s\", \"15m\", \"1h30m\")"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{text:?}: {} is too large", &rest[..digits]))?;
        let unit = match &rest[digits..digits + unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?} (ms, s, m, h or d)"
                ))
            }
        };
        let part = unit
            .checked_mul(u32::try_from(n).map_err(|_| format!("{text:?}: {n} is too large"))?)
            .ok_or_else(|| format!("{text:?} is too long"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("{text:?} is too long"))?;
        rest = &rest[digits + unit_len..];
    }
    Ok(total)
}

fn from_secs(secs: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("{secs} is not a valid number of seconds"))
}

/// Writes `d` as seconds.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Reads seconds or a duration string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(Visit)
}

struct Visit;

impl serde::de::Visitor<'_> for Visit {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration: seconds, or a string such as \"30s\" or \"15m\"")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
        Ok(Duration::from_secs(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
        u64::try_from(v)
            .map(Duration::from_secs)
            .map_err(|_| E::custom(format!("{v} is not a valid number of seconds")))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Duration, E> {
        from_secs(v).map_err(E::custom)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
        parse(v).map_err(E::custom)
    }
}

/// The same encoding for an `Option<Duration>` (`null` or absent is `None`).
pub mod option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes seconds, or nothing.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    /// Reads seconds, a duration string, or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super")] Duration);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|Wrapped(d)| d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_seconds_and_unit_strings_and_names_what_is_wrong() {
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "m", "-1", "1.5m", "15 m", "3w", "99999999999999999999s"] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(parse("3w").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn reads_numbers_strings_and_null_and_writes_seconds() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct S {
            #[serde(with = "super")]
            d: Duration,
            #[serde(default, with = "super::option")]
            o: Option<Duration>,
        }
        let read = |json: &str| serde_json::from_str::<S>(json);
        assert_eq!(read(r#"{"d": 2}"#).unwrap().d, Duration::from_secs(2));
        assert_eq!(read(r#"{"d": 0.5}"#).unwrap().d, Duration::from_millis(500));
        assert_eq!(
            read(r#"{"d": "2m", "o": "1s"}"#).unwrap().o,
            Some(Duration::from_secs(1))
        );
        assert_eq!(read(r#"{"d": 1, "o": null}"#).unwrap().o, None);
        assert!(read(r#"{"d": -1}"#).is_err());
        assert!(read(r#"{"d": "soon"}"#).is_err());
        let written = serde_json::to_string(&S {
            d: Duration::from_millis(1500),
            o: None,
        })
        .unwrap();
        assert_eq!(written, r#"{"d":1.5,"o":null}"#);
    }
}
