//! Kernel-name rules: data files, one per backend (`data/kernels/*.toml`), that say which op of
//! the op graph, or which op class or collective, a kernel is. Users extend them with their own
//! file (`calibrate --rules`), whose rules are tried first.
//!
//! ```toml
//! backend = "ascend"
//! source = "where the kernel names come from"
//!
//! [[rule]]
//! type = "GroupedMatmul*"      # glob on the op type (Ascend `Type`), and/or
//! match = "*GroupedMatmul*"    # glob on the kernel name (`*` any text, `?` one character)
//! op = "experts"               # an op of the op graph: its class follows from the op graph
//! note = "why this rule holds"
//!
//! [[rule]]
//! match = "*FlashAttnBwd*"
//! class = "attention"          # a class (gemm, grouped_gemm, attention, indexer, elementwise)
//!                              # or a collective (comm:dispatch, comm:all_reduce, ...)
//! outside = "backward pass"    # recognized, but not an op of inference: reported apart
//! ```
//!
//! A rule gives `op`, or `class`, or `outside` (with an optional `class` saying what kind of work
//! it is). The first rule that matches wins; a kernel no rule matches is reported as unmapped.

use super::ops::{op_catalog, OpKindName};
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// The built-in rules of the Ascend (CANN) backend.
pub const ASCEND_RULES: &str = include_str!("../../data/kernels/ascend.toml");
/// The built-in rules of the CUDA backend.
pub const CUDA_RULES: &str = include_str!("../../data/kernels/cuda.toml");
/// The built-in rules of the CPU engine (its ops map as themselves; this covers the rest).
pub const CPU_RULES: &str = include_str!("../../data/kernels/cpu.toml");

/// Where a trace comes from: decides the built-in rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// torch_npu / msprof on Ascend NPUs (CANN op names).
    Ascend,
    /// The PyTorch profiler on NVIDIA GPUs (CUDA kernel names).
    Cuda,
    /// dstwin's CPU engine: kernels already carry the op graph's names.
    Cpu,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Ascend, Backend::Cuda, Backend::Cpu];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Ascend => "ascend",
            Backend::Cuda => "cuda",
            Backend::Cpu => "cpu",
        }
    }

    pub fn parse(text: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == text)
    }

    /// The built-in rules.
    pub fn builtin_rules(self) -> RuleSet {
        let (file, text) = match self {
            Backend::Ascend => ("calibration/data/kernels/ascend.toml", ASCEND_RULES),
            Backend::Cuda => ("calibration/data/kernels/cuda.toml", CUDA_RULES),
            Backend::Cpu => ("calibration/data/kernels/cpu.toml", CPU_RULES),
        };
        RuleSet::parse(file, text).expect("built-in kernel rules are valid (tested)")
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A rule file that cannot be used; each names the file, the rule and the field.
#[derive(Debug, Error)]
pub enum RuleError {
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("{file}: rule {index} ({pattern}): {message}")]
    Rule {
        file: String,
        /// 1-based position among the file's `[[rule]]` tables.
        index: usize,
        pattern: String,
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    backend: String,
    source: String,
    #[serde(default, rename = "rule")]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default, rename = "match")]
    name: Option<String>,
    #[serde(default, rename = "type")]
    op_type: Option<String>,
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    class: Option<String>,
    #[serde(default)]
    outside: Option<String>,
    #[serde(default)]
    note: Option<String>,
}

/// A glob: `*` matches any text, `?` one character; everything else itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Glob(String);

impl Glob {
    pub fn new(pattern: &str) -> Glob {
        Glob(pattern.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, text: &str) -> bool {
        let p: Vec<char> = self.0.chars().collect();
        let t: Vec<char> = text.chars().collect();
        // Greedy with one backtrack point: the last `*` and where its match ends.
        let (mut i, mut j) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while j < t.len() {
            if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
                i += 1;
                j += 1;
            } else if i < p.len() && p[i] == '*' {
                star = Some((i, j));
                i += 1;
            } else if let Some((si, sj)) = star {
                i = si + 1;
                j = sj + 1;
                star = Some((si, sj + 1));
            } else {
                return false;
            }
        }
        p[i..].iter().all(|&c| c == '*')
    }
}

/// What a rule maps a kernel to.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleTarget {
    /// An op of the op graph, with its kind.
    Op { op: &'static str, kind: OpKindName },
    /// A class or collective, no particular op.
    Kind(OpKindName),
    /// Recognized but not an op of inference (backward pass, optimizer, profiler work); the
    /// kind of work it is when the rule says.
    Outside {
        reason: String,
        kind: Option<OpKindName>,
    },
}

/// One rule, as read and checked.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    pub name: Option<Glob>,
    pub op_type: Option<Glob>,
    pub target: RuleTarget,
    pub note: Option<String>,
    /// The file and 1-based position the rule came from, for reports.
    pub file: String,
    pub index: usize,
}

impl Rule {
    pub fn matches(&self, name: &str, op_type: Option<&str>) -> bool {
        self.name.as_ref().is_none_or(|g| g.matches(name))
            && self
                .op_type
                .as_ref()
                .is_none_or(|g| op_type.is_some_and(|t| g.matches(t)))
    }

    /// The patterns, for messages: `type=GroupedMatmul*` and/or `match=*gemm*`.
    pub fn pattern(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = &self.op_type {
            parts.push(format!("type={}", t.as_str()));
        }
        if let Some(n) = &self.name {
            parts.push(format!("match={}", n.as_str()));
        }
        parts.join(" ")
    }
}

/// Rules in the order they are tried.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
    /// The backend and source of each file read, in order.
    pub sources: Vec<(String, String)>,
}

impl RuleSet {
    /// Parses and checks a rule file: every rule has a pattern and one target, ops exist in the
    /// op graph, classes are known.
    pub fn parse(file: &str, text: &str) -> Result<RuleSet, RuleError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| RuleError::File {
            file: file.to_owned(),
            message: e.to_string(),
        })?;
        if Backend::parse(&raw.backend).is_none() {
            return Err(RuleError::File {
                file: file.to_owned(),
                message: format!(
                    "backend = {:?}: must be one of {}",
                    raw.backend,
                    Backend::ALL.map(Backend::name).join(", ")
                ),
            });
        }
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (i, r) in raw.rules.into_iter().enumerate() {
            rules.push(check(file, i + 1, r)?);
        }
        Ok(RuleSet {
            rules,
            sources: vec![(raw.backend, raw.source)],
        })
    }

    /// These rules, then `later`'s.
    pub fn then(mut self, later: RuleSet) -> RuleSet {
        self.rules.extend(later.rules);
        self.sources.extend(later.sources);
        self
    }

    /// The first rule matching a kernel.
    pub fn find(&self, name: &str, op_type: Option<&str>) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(name, op_type))
    }
}

fn check(file: &str, index: usize, r: RawRule) -> Result<Rule, RuleError> {
    let pattern = [("type", &r.op_type), ("match", &r.name)]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(" ");
    let bad = |message: String| RuleError::Rule {
        file: file.to_owned(),
        index,
        pattern: if pattern.is_empty() {
            "no pattern".into()
        } else {
            pattern.clone()
        },
        message,
    };
    if r.name.is_none() && r.op_type.is_none() {
        return Err(bad(
            "give `match` (kernel name) and/or `type` (op type)".into()
        ));
    }
    if [&r.name, &r.op_type]
        .iter()
        .any(|p| p.as_ref().is_some_and(|p| p.is_empty()))
    {
        return Err(bad(
            "a pattern must not be empty (`*` matches anything)".into()
        ));
    }
    let kind = match &r.class {
        None => None,
        Some(c) => Some(OpKindName::parse(c).ok_or_else(|| {
            bad(format!(
                "class = {c:?}: not an op class (gemm, grouped_gemm, attention, indexer, elementwise) or collective (comm:dispatch, comm:combine, comm:all_reduce, comm:all_gather, comm:reduce_scatter, comm:p2p)"
            ))
        })?),
    };
    let target = match (&r.op, &r.outside) {
        (Some(_), Some(_)) => return Err(bad("give `op` or `outside`, not both".into())),
        (Some(op), None) => {
            let (name, op_kind) = op_catalog()
                .get_key_value(op.as_str())
                .ok_or_else(|| {
                    bad(format!(
                        "op = {op:?}: not an op of the op graph (the names `dstwin explain` prints: {})",
                        op_catalog().keys().copied().collect::<Vec<_>>().join(", ")
                    ))
                })?;
            if let Some(k) = kind.filter(|k| k != op_kind) {
                return Err(bad(format!(
                    "class = {k} contradicts op {op}, which the op graph makes {op_kind}"
                )));
            }
            RuleTarget::Op {
                op: name,
                kind: *op_kind,
            }
        }
        (None, Some(reason)) => RuleTarget::Outside {
            reason: reason.clone(),
            kind,
        },
        (None, None) => {
            RuleTarget::Kind(kind.ok_or_else(|| bad("give `op`, `class` or `outside`".into()))?)
        }
    };
    Ok(Rule {
        name: r.name.as_deref().map(Glob::new),
        op_type: r.op_type.as_deref().map(Glob::new),
        target,
        note: r.note,
        file: file.to_owned(),
        index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_shells_do() {
        let g = Glob::new("*dpsk::ep::*dispatch<*");
        assert!(g.matches("void dpsk::ep::internode::dispatch<false, 8>(int4*)"));
        assert!(!g.matches("void dpsk::ep::internode::combine<false, 8>(int4*)"));
        assert!(Glob::new("MatMul*").matches("MatMulV2"));
        assert!(!Glob::new("MatMul*").matches("BatchMatMulV2"));
        assert!(Glob::new("a?c").matches("abc"));
        assert!(!Glob::new("a?c").matches("ac"));
        assert!(Glob::new("*").matches(""));
        assert!(Glob::new("**a**").matches("xxa"));
        assert!(Glob::new("*ab*ab").matches("abxabab"));
        assert!(!Glob::new("abc").matches("abcd"));
    }

    #[test]
    fn built_in_rules_parse() {
        for b in Backend::ALL {
            assert!(!b.builtin_rules().rules.is_empty(), "{b}");
        }
    }

    #[test]
    fn bad_rules_name_the_rule_and_field() {
        let file =
            |rule: &str| format!("backend = \"cuda\"\nsource = \"test\"\n[[rule]]\n{rule}\n");
        for (rule, want) in [
            ("op = \"experts\"", "give `match`"),
            ("match = \"x\"\nop = \"expert\"", "op = \"expert\""),
            ("match = \"x\"\nclass = \"gem\"", "class = \"gem\""),
            ("match = \"x\"", "give `op`, `class` or `outside`"),
            (
                "match = \"x\"\nop = \"experts\"\nclass = \"gemm\"",
                "contradicts",
            ),
            (
                "match = \"x\"\nop = \"experts\"\noutside = \"y\"",
                "not both",
            ),
            ("match = \"\"\nclass = \"gemm\"", "must not be empty"),
            ("match = \"x\"\nclas = \"gemm\"", "clas"),
        ] {
            let e = RuleSet::parse("r.toml", &file(rule))
                .unwrap_err()
                .to_string();
            assert!(e.contains("r.toml") && e.contains(want), "{rule}: {e}");
        }
        let e = RuleSet::parse("r.toml", "backend = \"tpu\"\nsource = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tpu"), "{e}");
    }
}
