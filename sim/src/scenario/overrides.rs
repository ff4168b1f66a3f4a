//! `--set PATH=VALUE` overrides, applied to the parsed TOML before it is read.

use super::raw::InstanceSpec;
use super::{field, ScenarioError};

/// Applies `path=value` overrides to a parsed scenario. The first path segment names a top-level
/// table or an instance (`decode.max_num_seqs=64` finds `max_num_seqs` in the instance named
/// `decode`, in its table or its `scheduler` table). Values are TOML (`64`, `true`, `"x"`); bare
/// words are taken as strings.
pub fn apply_overrides(doc: &mut toml::Table, sets: &[String]) -> Result<(), ScenarioError> {
    for s in sets {
        let (path, raw) = s.split_once('=').ok_or_else(|| {
            field(
                "--set",
                s,
                "expected PATH=VALUE, e.g. decode.max_num_seqs=64",
            )
        })?;
        let value: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
            Ok(mut t) => t.remove("v").expect("parsed the key just written"),
            Err(_) => toml::Value::String(raw.to_string()),
        };
        let parts: Vec<&str> = path.split('.').collect();
        let not_found = || {
            field(
                "--set",
                s,
                "no such field in the scenario (see docs/scenarios.md)",
            )
        };
        // An instance name first?
        if parts.len() >= 2 {
            if let Some(instances) = doc.get_mut("instance").and_then(toml::Value::as_array_mut) {
                if let Some(inst) = instances
                    .iter_mut()
                    .filter_map(toml::Value::as_table_mut)
                    .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(parts[0]))
                {
                    let rest = &parts[1..];
                    let target = if rest.len() == 1 && !is_instance_key(rest[0]) {
                        inst.entry("scheduler")
                            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                            .as_table_mut()
                            .ok_or_else(not_found)?
                    } else {
                        inst
                    };
                    set_path(target, rest, value).ok_or_else(not_found)?;
                    continue;
                }
            }
        }
        set_path(doc, &parts, value).ok_or_else(not_found)?;
    }
    Ok(())
}

/// Whether `k` is a field of an instance's own table (not of its `scheduler` table): read from
/// the instance's schema ([`InstanceSpec`]), so that a new field needs no list here.
fn is_instance_key(k: &str) -> bool {
    struct_fields::<InstanceSpec>().contains(&k)
}

/// The field names serde reads for the struct `T`, asked of its `Deserialize` by a
/// deserializer that records them and stops.
fn struct_fields<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

fn set_path(t: &mut toml::Table, parts: &[&str], v: toml::Value) -> Option<()> {
    let (last, head) = parts.split_last()?;
    let mut cur = t;
    for p in head {
        cur = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()?;
    }
    cur.insert(last.to_string(), v);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_keys_come_from_the_instance_schema() {
        for k in [
            "dies",
            "tp",
            "enable_dsa_cp",
            "mtp_tokens",
            "scheduler",
            "placement",
        ] {
            assert!(is_instance_key(k), "{k}");
        }
        for k in ["max_num_seqs", "block_size", "nonsense"] {
            assert!(!is_instance_key(k), "{k}");
        }
    }
}
