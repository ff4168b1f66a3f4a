//! torch_npu's `communication.json` (`ASCEND_PROFILER_OUTPUT`): per step, per kind (`collective`,
//! `p2p`), per op `NAME@GROUP`:
//!
//! ```json
//! {"step1": {"collective": {"hcom_allReduce__844_2_1@13681369207305868844": {
//!     "Communication Time Info": {"Start Timestamp(us)": 1713174287432401.2, "Elapse Time(ms)": 2.9042, ...},
//!     "Communication Bandwidth Info": {"HCCS": {"Transit Size(MB)": 176.16, ...}, "SDMA": {...}, "RDMA": {...}}
//! }}}}
//! ```
//!
//! Each op becomes one record: its name and group from the key, start and elapsed time, and the
//! bytes it moved, `RDMA + max(SDMA, HCCS + PCIE + SIO)` (SDMA is the copy engine carrying the
//! on-node links' traffic, so adding it to them would count those bytes twice; MB = 10^6 bytes).
//! `Total Op Info` entries are sums of the others and are left out. The group's size is not in
//! the file. Streamed op by op; errors name the line.

use super::chrome::{raise, syntax, Counting};
use super::number::{value_amount, value_ns, MS, US};
use super::{CommRecord, KernelRecord, Names, Profile, ProfileFormat};
use crate::error::TraceError;
use crate::reader::{open, shown};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufReader, Read};
use std::path::Path;
use std::rc::Rc;

const TOTAL: &str = "Total Op Info";
const BYTES_PER_MB: f64 = 1e6;

#[derive(Deserialize)]
struct OpInfo {
    #[serde(rename = "Communication Time Info")]
    time: TimeInfo,
    #[serde(rename = "Communication Bandwidth Info", default)]
    bandwidth: BTreeMap<String, LinkInfo>,
}

#[derive(Deserialize)]
struct TimeInfo {
    #[serde(rename = "Start Timestamp(us)", default)]
    start: Option<Value>,
    #[serde(rename = "Elapse Time(ms)")]
    elapse: Value,
}

#[derive(Deserialize)]
struct LinkInfo {
    #[serde(rename = "Transit Size(MB)", default)]
    size: Option<Value>,
}

/// Reads `communication.json` from a file.
pub fn from_path(path: impl AsRef<Path>) -> Result<Profile, TraceError> {
    let path = path.as_ref();
    from_reader(open(path)?, &path.display().to_string())
}

/// Reads `communication.json` from any reader; `origin` labels errors and the profile.
pub fn from_reader(reader: impl Read, origin: &str) -> Result<Profile, TraceError> {
    let lines = Rc::new(Cell::new(0u64));
    let counting = Counting {
        inner: BufReader::new(reader),
        lines: lines.clone(),
    };
    let mut st = State {
        origin: origin.to_owned(),
        lines,
        names: Names::default(),
        profile: Profile::new(origin, ProfileFormat::CommunicationJson),
        error: None,
    };
    let mut de = serde_json::Deserializer::from_reader(counting);
    let read = Steps { st: &mut st }
        .deserialize(&mut de)
        .and_then(|()| de.end());
    if let Err(e) = read {
        return Err(st.error.take().unwrap_or_else(|| syntax(origin, &e)));
    }
    st.profile.sort();
    Ok(st.profile)
}

struct State {
    origin: String,
    lines: Rc<Cell<u64>>,
    names: Names,
    profile: Profile,
    error: Option<TraceError>,
}

impl State {
    fn op(&mut self, step: Option<u64>, key: &str, info: OpInfo) -> Result<(), TraceError> {
        let line = self.lines.get() + 1;
        let bad = |field: &str, v: &Value, reason: &str| TraceError::BadField {
            origin: self.origin.clone(),
            line,
            field: format!("{key}.{field}"),
            value: shown(&v.to_string()),
            reason: reason.to_owned(),
        };
        let dur_ns = value_ns(&info.time.elapse, MS).map_err(|r| {
            bad(
                "Communication Time Info.Elapse Time(ms)",
                &info.time.elapse,
                r,
            )
        })?;
        let start_ns = match &info.time.start {
            None => None,
            Some(v) => Some(
                value_ns(v, US)
                    .map_err(|r| bad("Communication Time Info.Start Timestamp(us)", v, r))?,
            ),
        };
        let mut mb = BTreeMap::new();
        for (link, l) in &info.bandwidth {
            let size = match &l.size {
                None => 0.0,
                Some(v) => value_amount(v).ok_or_else(|| {
                    bad(
                        &format!("Communication Bandwidth Info.{link}.Transit Size(MB)"),
                        v,
                        "expected a number >= 0",
                    )
                })?,
            };
            mb.insert(link.as_str(), size);
        }
        let get = |l: &str| mb.get(l).copied().unwrap_or(0.0);
        let on_node = get("HCCS") + get("PCIE") + get("SIO");
        let bytes = (get("RDMA") + get("SDMA").max(on_node)) * BYTES_PER_MB;
        let (name, group) = match key.split_once('@') {
            Some((n, g)) => (n, Some(g.to_owned())),
            None => (key, None),
        };
        let mut k = KernelRecord::new(self.names.get(name), start_ns, dur_ns, line);
        k.step = step;
        k.comm = Some(CommRecord {
            collective: None,
            group,
            group_size: None,
            bytes: (!mb.is_empty()).then_some(bytes),
        });
        self.profile.kernels.push(k);
        Ok(())
    }
}

/// `step1` -> 1; other keys have no step number.
fn step_number(key: &str) -> Option<u64> {
    key.strip_prefix("step").and_then(|n| n.parse().ok())
}

/// The top level: steps.
struct Steps<'a> {
    st: &'a mut State,
}

impl<'de> DeserializeSeed<'de> for Steps<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Steps<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of steps")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            map.next_value_seed(Kinds {
                st: self.st,
                step: step_number(&key),
            })?;
        }
        Ok(())
    }
}

/// One step: `collective`, `p2p`.
struct Kinds<'a> {
    st: &'a mut State,
    step: Option<u64>,
}

impl<'de> DeserializeSeed<'de> for Kinds<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Kinds<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of op kinds (`collective`, `p2p`)")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<String>()?.is_some() {
            map.next_value_seed(Ops {
                st: self.st,
                step: self.step,
            })?;
        }
        Ok(())
    }
}

/// One kind: ops by `NAME@GROUP`.
struct Ops<'a> {
    st: &'a mut State,
    step: Option<u64>,
}

impl<'de> DeserializeSeed<'de> for Ops<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Ops<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of communication ops")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == TOTAL {
                map.next_value::<de::IgnoredAny>()?;
                self.st.profile.skip(TOTAL);
                continue;
            }
            let info: OpInfo = map.next_value()?;
            if let Err(e) = self.st.op(self.step, &key, info) {
                return Err(raise(&mut self.st.error, e));
            }
        }
        Ok(())
    }
}
