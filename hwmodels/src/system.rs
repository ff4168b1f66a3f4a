//! Systems: a chip, how packages group into nodes and supernodes, and the fabric levels that
//! join them.

use crate::chip::Chip;
use crate::error::{check_range, invalid, HwError};
use serde::{Deserialize, Serialize};

/// How far a group of dies reaches, innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Dies of one package (910C: two dies on one package).
    Package,
    /// Packages of one server (HCCS / NVLink).
    Node,
    /// Nodes of one supernode (CloudMatrix384's UB plane).
    Supernode,
    /// Anything beyond (RoCE / InfiniBand).
    Cluster,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Package => "package",
            Scope::Node => "node",
            Scope::Supernode => "supernode",
            Scope::Cluster => "cluster",
        }
    }
}

/// One level of interconnect, usable by groups whose span is at most `scope`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricLevel {
    /// e.g. "HCCS", "UB", "RoCE".
    pub name: String,
    /// The widest span this level serves.
    pub scope: Scope,
    /// One-way bandwidth one die can drive into this level, GB/s.
    pub bw_gb_s_per_die: f64,
    /// Base latency of one message, microseconds.
    pub latency_us: f64,
    pub source: String,
}

/// The chip of a system: a catalog name or a full inline definition.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChipRef {
    Name(String),
    Inline(Chip),
}

// By hand rather than `#[serde(untagged)]`: an untagged enum that matches neither form says only
// "data did not match any variant", hiding which field of an inline chip is wrong.
impl<'de> Deserialize<'de> for ChipRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ChipRef;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a chip name (see `dstwin catalog`) or an inline chip table")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ChipRef, E> {
                Ok(ChipRef::Name(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ChipRef, A::Error> {
                Chip::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ChipRef::Inline)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A system as written in a data file, before the chip reference is resolved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemFile {
    pub name: String,
    pub description: String,
    pub chip: ChipRef,
    /// Name of the cost-model parameter file (`costs/<name>.toml`) or inline path.
    pub cost_model: String,
    pub packages_per_node: u32,
    /// Nodes joined by a supernode fabric (CloudMatrix384: 48); absent when there is none.
    #[serde(default)]
    pub nodes_per_supernode: Option<u32>,
    /// The most nodes a deployment on this system may use.
    pub max_nodes: u32,
    /// HBM per die that the runtime, driver and framework keep for themselves, GB.
    pub reserved_hbm_gb_per_die: f64,
    /// Fabric levels, innermost first.
    pub fabric: Vec<FabricLevel>,
    pub source: String,
}

/// A validated system.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct System {
    pub name: String,
    pub description: String,
    pub chip: Chip,
    pub cost_model: String,
    pub packages_per_node: u32,
    pub nodes_per_supernode: Option<u32>,
    pub max_nodes: u32,
    pub reserved_hbm_gb_per_die: f64,
    pub fabric: Vec<FabricLevel>,
    pub source: String,
}

/// The most dies a system may have: a thousand times the largest one built in (CloudMatrix384,
/// 768 dies), and small enough that sums and products of die counts stay inside u32.
pub const MAX_DIES: u64 = 1 << 20;

impl System {
    pub(crate) fn from_file(raw: SystemFile, chip: Chip, file: &str) -> Result<System, HwError> {
        chip.validate(file)?;
        if raw.packages_per_node == 0 {
            return Err(invalid(file, "packages_per_node", 0, "must be at least 1"));
        }
        if raw.max_nodes == 0 {
            return Err(invalid(file, "max_nodes", 0, "must be at least 1"));
        }
        if let Some(n) = raw.nodes_per_supernode {
            if n == 0 || n > raw.max_nodes {
                return Err(invalid(
                    file,
                    "nodes_per_supernode",
                    n,
                    "must be between 1 and max_nodes",
                ));
            }
        }
        // Die counts are u32 products of these; bound the largest one (the CloudMatrix384
        // supernode has 768 dies) so that no product or sum of them can overflow.
        // Three u32 factors can overflow u64 too: saturate (anything that large is refused).
        let max_dies = u64::from(raw.packages_per_node)
            .saturating_mul(u64::from(chip.dies_per_package))
            .saturating_mul(u64::from(raw.max_nodes));
        if max_dies > MAX_DIES {
            return Err(invalid(
                file,
                "max_nodes",
                raw.max_nodes,
                &format!(
                    "{} packages per node x {} dies per package x {} nodes = {max_dies} dies; at most {MAX_DIES}",
                    raw.packages_per_node, chip.dies_per_package, raw.max_nodes
                ),
            ));
        }
        if !(raw.reserved_hbm_gb_per_die >= 0.0 && raw.reserved_hbm_gb_per_die < chip.hbm_gb) {
            return Err(invalid(
                file,
                "reserved_hbm_gb_per_die",
                raw.reserved_hbm_gb_per_die,
                "must be at least 0 and below the chip's HBM",
            ));
        }
        if raw.fabric.is_empty() {
            return Err(invalid(file, "fabric", "[]", "needs at least one level"));
        }
        for (i, l) in raw.fabric.iter().enumerate() {
            check_range(
                file,
                format!("fabric[{i}].bw_gb_s_per_die"),
                l.bw_gb_s_per_die,
                (1e-3, 1e6),
                "0.001 to 1,000,000 GB/s",
            )?;
            check_range(
                file,
                format!("fabric[{i}].latency_us"),
                l.latency_us,
                (0.0, 1e6),
                "0 to 1,000,000 us",
            )?;
            if i > 0 && l.scope <= raw.fabric[i - 1].scope {
                return Err(invalid(
                    file,
                    format!("fabric[{i}].scope"),
                    l.scope.name(),
                    "levels must be listed innermost first, each wider than the last",
                ));
            }
        }
        if raw.fabric.last().map(|l| l.scope) != Some(Scope::Cluster)
            && raw.max_nodes > raw.nodes_per_supernode.unwrap_or(1)
        {
            return Err(invalid(file, "fabric", "(levels)", "the system spans several nodes or supernodes, so the last level must have scope = \"cluster\""));
        }
        Ok(System {
            name: raw.name,
            description: raw.description,
            chip,
            cost_model: raw.cost_model,
            packages_per_node: raw.packages_per_node,
            nodes_per_supernode: raw.nodes_per_supernode,
            max_nodes: raw.max_nodes,
            reserved_hbm_gb_per_die: raw.reserved_hbm_gb_per_die,
            fabric: raw.fabric,
            source: raw.source,
        })
    }

    pub fn dies_per_package(&self) -> u32 {
        self.chip.dies_per_package
    }

    pub fn dies_per_node(&self) -> u32 {
        self.packages_per_node * self.chip.dies_per_package
    }

    /// Dies a supernode holds (a node when there is no supernode fabric).
    pub fn dies_per_supernode(&self) -> u32 {
        self.dies_per_node() * self.nodes_per_supernode.unwrap_or(1)
    }

    pub fn max_dies(&self) -> u32 {
        self.dies_per_node() * self.max_nodes
    }

    /// The span of a group of `dies` contiguous dies (groups are laid out packed).
    pub fn span(&self, dies: u32) -> Scope {
        if dies <= self.dies_per_package() {
            Scope::Package
        } else if dies <= self.dies_per_node() {
            Scope::Node
        } else if self.nodes_per_supernode.is_some() && dies <= self.dies_per_supernode() {
            Scope::Supernode
        } else {
            Scope::Cluster
        }
    }

    /// The fabric level a group of `dies` contiguous dies communicates over: the innermost level
    /// whose scope covers the group's span.
    pub fn level_for(&self, dies: u32) -> &FabricLevel {
        let span = self.span(dies);
        self.fabric
            .iter()
            .find(|l| l.scope >= span)
            .unwrap_or_else(|| self.fabric.last().expect("validated: at least one level"))
    }
}
