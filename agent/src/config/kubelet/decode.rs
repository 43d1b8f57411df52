//! Go-style decoders of KubeletConfiguration values: quantities that must not be negative,
//! strings, Go durations (`1m30s`), reserved resource maps, and YAML to JSON as
//! `sigs.k8s.io/yaml` does it.
use super::ReservedResources;
use crate::pods::quantity::Quantity;
use serde::Deserialize;
use std::fmt;
use std::time::Duration;

impl<'de> Deserialize<'de> for ReservedResources {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ReservedResources;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a map of resource name (cpu, memory, ephemeral-storage, pid) to quantity",
                )
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = ReservedResources::default();
                while let Some(name) = map.next_key::<String>()? {
                    let slot = match name.as_str() {
                        "cpu" => &mut out.cpu,
                        "memory" => &mut out.memory,
                        "ephemeral-storage" => &mut out.ephemeral_storage,
                        "pid" => &mut out.pid,
                        other => {
                            return Err(serde::de::Error::custom(format!(
                                "cannot reserve {other:?} resource (only cpu, memory, ephemeral-storage and pid can be)"
                            )));
                        }
                    };
                    *slot = Some(map.next_value::<NonNegativeQuantity>()?.0);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A quantity that must not be negative (reservations).
pub(super) struct NonNegativeQuantity(pub(super) Quantity);

impl<'de> Deserialize<'de> for NonNegativeQuantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let q = Quantity::deserialize(deserializer)?;
        if q.is_negative() {
            return Err(serde::de::Error::custom(format!(
                "resource quantity cannot be negative: {q}"
            )));
        }
        Ok(Self(q))
    }
}

/// A string or a bare number in a `map[string]string` field (`pid.available: 1000`).
pub(super) struct Text(pub(super) String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string (quote values such as \"true\")")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A Go `time.Duration` string (`100ms`, `1m30s`, `1.5s`).
pub(super) struct GoDuration(pub(super) Duration);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_go_duration(&text)
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

/// Why a Go duration does not parse; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?}")]
    Invalid(String),
    #[error("duration {0:?} must not be negative")]
    Negative(String),
    #[error("missing unit in duration {0:?}")]
    MissingUnit(String),
    #[error("unknown unit {unit:?} in duration {text:?}")]
    UnknownUnit { unit: String, text: String },
    #[error("{0:?}: must be positive")]
    NotPositive(String),
}

/// Parses a non-negative Go duration (`time.ParseDuration`): a sequence of decimal numbers with
/// units `ns`, `us` (`µs`), `ms`, `s`, `m`, `h`; `0` needs no unit.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(text.to_owned());
    let mut s = text;
    if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    } else if s.starts_with('-') {
        return Err(DurationError::Negative(text.to_owned()));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (int_part, rest) = s.split_at(int_end);
        let (frac_part, rest) = match rest.strip_prefix('.') {
            Some(after) => {
                let end = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(end)
            }
            None => ("", rest),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_end = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(DurationError::MissingUnit(text.to_owned())),
            other => {
                return Err(DurationError::UnknownUnit {
                    unit: other.to_owned(),
                    text: text.to_owned(),
                });
            }
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        // Fraction digits beyond nanosecond precision cannot change the result; Go drops them too.
        let frac_digits = &frac_part[..frac_part.len().min(18)];
        let frac: u128 = if frac_digits.is_empty() {
            0
        } else {
            frac_digits.parse().map_err(|_| invalid())?
        };
        let scale = 10u128.pow(u32::try_from(frac_digits.len()).map_err(|_| invalid())?);
        total = whole
            .checked_mul(unit_nanos)
            .and_then(|v| v.checked_add(frac * unit_nanos / scale))
            .and_then(|v| total.checked_add(v))
            .ok_or_else(invalid)?;
        s = rest;
    }
    // Go durations are int64 nanoseconds.
    if total > u128::from(i64::MAX.unsigned_abs()) {
        return Err(invalid());
    }
    let nanos = u64::try_from(total).map_err(|_| invalid())?;
    Ok(Duration::from_nanos(nanos))
}

/// YAML to a JSON value, as `sigs.k8s.io/yaml.YAMLToJSON` does before kubelet decodes. Duplicate
/// keys are rejected (go-yaml: "mapping key already defined").
pub(super) fn yaml_to_json(text: &str) -> Result<serde_json::Value, SyntaxError> {
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)?;
    Ok(serde_json::to_value(&yaml)?)
}

/// A file that is not YAML (or JSON) at all.
#[derive(Debug, thiserror::Error)]
pub(super) enum SyntaxError {
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

pub(super) fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "nothing (null)",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}
