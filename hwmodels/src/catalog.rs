//! The built-in catalog (data files embedded at build time) and loading of users' own files.

use crate::chip::Chip;
use crate::cost::{CostModel, CostParams};
use crate::error::HwError;
use crate::system::{ChipRef, System, SystemFile};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

const CHIPS: &str = include_str!("../data/chips.toml");
const SYSTEMS: &[(&str, &str)] = &[
    (
        "systems/cloudmatrix384.toml",
        include_str!("../data/systems/cloudmatrix384.toml"),
    ),
    (
        "systems/atlas-a3-superpod.toml",
        include_str!("../data/systems/atlas-a3-superpod.toml"),
    ),
    (
        "systems/atlas-800-a3.toml",
        include_str!("../data/systems/atlas-800-a3.toml"),
    ),
    (
        "systems/atlas-800i-a2.toml",
        include_str!("../data/systems/atlas-800i-a2.toml"),
    ),
    (
        "systems/nvidia-h800-8.toml",
        include_str!("../data/systems/nvidia-h800-8.toml"),
    ),
    (
        "systems/nvidia-h100-8.toml",
        include_str!("../data/systems/nvidia-h100-8.toml"),
    ),
    (
        "systems/nvidia-h200-8.toml",
        include_str!("../data/systems/nvidia-h200-8.toml"),
    ),
];
const COSTS: &[(&str, &str)] = &[
    (
        "costs/ascend-910c.toml",
        include_str!("../data/costs/ascend-910c.toml"),
    ),
    (
        "costs/ascend-910b.toml",
        include_str!("../data/costs/ascend-910b.toml"),
    ),
    (
        "costs/nvidia-hopper.toml",
        include_str!("../data/costs/nvidia-hopper.toml"),
    ),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChipsFile {
    chip: Vec<Chip>,
}

/// Merges `over` into `base`: tables key by key, recursively; anything else replaces.
fn merge_tables(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn parse<T: for<'de> Deserialize<'de>>(file: &str, text: &str) -> Result<T, HwError> {
    toml::from_str(text).map_err(|e| HwError::Parse {
        file: file.to_string(),
        message: e.to_string(),
    })
}

/// Chips, systems and cost-parameter sets by name.
#[derive(Clone, Debug)]
pub struct Catalog {
    chips: BTreeMap<String, Chip>,
    systems: BTreeMap<String, System>,
    costs: BTreeMap<String, CostParams>,
}

impl Catalog {
    /// The catalog built into the binary. Panics only if a shipped data file is broken, which the
    /// test suite rules out.
    pub fn builtin() -> &'static Catalog {
        static CAT: OnceLock<Catalog> = OnceLock::new();
        CAT.get_or_init(|| {
            Catalog::load_builtin()
                .unwrap_or_else(|e| panic!("built-in hardware data is invalid: {e}"))
        })
    }

    fn load_builtin() -> Result<Catalog, HwError> {
        let mut cat = Catalog {
            chips: BTreeMap::new(),
            systems: BTreeMap::new(),
            costs: BTreeMap::new(),
        };
        for chip in parse::<ChipsFile>("chips.toml", CHIPS)?.chip {
            chip.validate("chips.toml")?;
            cat.chips.insert(chip.name.clone(), chip);
        }
        for (file, text) in COSTS {
            let p = cat.cost_params_from_str(file, text)?;
            cat.costs.insert(p.name.clone(), p);
        }
        for (file, text) in SYSTEMS {
            let s = cat.system_from_str(file, text, None)?;
            cat.systems.insert(s.name.clone(), s);
        }
        Ok(cat)
    }

    pub fn chip_names(&self) -> impl Iterator<Item = &str> {
        self.chips.keys().map(String::as_str)
    }
    pub fn system_names(&self) -> impl Iterator<Item = &str> {
        self.systems.keys().map(String::as_str)
    }
    pub fn systems(&self) -> impl Iterator<Item = &System> {
        self.systems.values()
    }
    pub fn chips(&self) -> impl Iterator<Item = &Chip> {
        self.chips.values()
    }
    pub fn cost_sets(&self) -> impl Iterator<Item = &CostParams> {
        self.costs.values()
    }

    fn unknown(kind: &'static str, name: &str, known: impl Iterator<Item = String>) -> HwError {
        HwError::Unknown {
            kind,
            name: name.to_string(),
            known: known.collect::<Vec<_>>().join(", "),
        }
    }

    pub fn chip(&self, name: &str) -> Result<&Chip, HwError> {
        self.chips
            .get(name)
            .ok_or_else(|| Self::unknown("chip", name, self.chips.keys().cloned()))
    }

    pub fn system(&self, name: &str) -> Result<&System, HwError> {
        self.systems
            .get(name)
            .ok_or_else(|| Self::unknown("hardware system", name, self.systems.keys().cloned()))
    }

    pub fn cost_params(&self, name: &str) -> Result<&CostParams, HwError> {
        self.costs
            .get(name)
            .ok_or_else(|| Self::unknown("cost model", name, self.costs.keys().cloned()))
    }

    /// A system by catalog name, or from a TOML file when `name_or_path` ends in `.toml`.
    pub fn resolve_system(&self, name_or_path: &str) -> Result<System, HwError> {
        if name_or_path.ends_with(".toml") {
            let path = Path::new(name_or_path);
            let text = std::fs::read_to_string(path).map_err(|source| HwError::Io {
                file: name_or_path.to_string(),
                source,
            })?;
            self.system_from_str(name_or_path, &text, path.parent())
        } else {
            self.system(name_or_path).cloned()
        }
    }

    /// Parses and validates a system file. Its chip is a catalog name or an inline table; its
    /// cost model a catalog name or a `.toml` path relative to `base_dir`.
    pub fn system_from_str(
        &self,
        file: &str,
        text: &str,
        base_dir: Option<&Path>,
    ) -> Result<System, HwError> {
        let raw: SystemFile = parse(file, text)?;
        let chip = match &raw.chip {
            ChipRef::Name(n) => self.chip(n)?.clone(),
            ChipRef::Inline(c) => c.clone(),
        };
        if raw.cost_model.ends_with(".toml") {
            self.load_cost_file(&raw.cost_model, base_dir)?;
        } else {
            self.cost_params(&raw.cost_model)?;
        }
        System::from_file(raw, chip, file)
    }

    fn load_cost_file(&self, rel: &str, base_dir: Option<&Path>) -> Result<CostParams, HwError> {
        let path = base_dir.map_or_else(|| Path::new(rel).to_path_buf(), |d| d.join(rel));
        let label = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| HwError::Io {
            file: label.clone(),
            source,
        })?;
        self.cost_params_from_str(&label, &text)
    }

    /// Parses and validates a cost file. A file with `inherits = "NAME"` takes every number it
    /// does not give from the catalog's cost model NAME: its tables merge into NAME's key by key
    /// (a table it gives replaces only the keys it gives, `source` included; arrays and values
    /// replace whole).
    pub fn cost_params_from_str(&self, file: &str, text: &str) -> Result<CostParams, HwError> {
        let own: toml::Table = parse(file, text)?;
        let merged = match own.get("inherits") {
            None => own,
            Some(toml::Value::String(base)) => {
                let b = self.cost_params(base).map_err(|e| match e {
                    HwError::Unknown { known, .. } => crate::error::invalid(
                        file,
                        "inherits",
                        format!("{base:?}"),
                        &format!("no such cost model in the catalog; known: {known}"),
                    ),
                    e => e,
                })?;
                let mut table = toml::Table::try_from(b).map_err(|e| HwError::Parse {
                    file: file.to_string(),
                    message: format!("cost model {base}: {e}"),
                })?;
                // What the base itself inherited is already in its numbers.
                table.remove("inherits");
                merge_tables(&mut table, own);
                table
            }
            Some(v) => {
                return Err(crate::error::invalid(
                    file,
                    "inherits",
                    v,
                    "must be the name of a cost model in the catalog",
                ))
            }
        };
        let p: CostParams = merged
            .try_into()
            .map_err(|e: toml::de::Error| HwError::Parse {
                file: file.to_string(),
                message: e.to_string(),
            })?;
        p.validate(file)?;
        Ok(p)
    }

    /// The cost model for a system: its parameter set from the catalog (or the file it names).
    pub fn cost_model(
        &self,
        system: &System,
        base_dir: Option<&Path>,
    ) -> Result<CostModel, HwError> {
        let params = if system.cost_model.ends_with(".toml") {
            self.load_cost_file(&system.cost_model, base_dir)?
        } else {
            self.cost_params(&system.cost_model)?.clone()
        };
        Ok(CostModel::new(system.clone(), params))
    }
}
