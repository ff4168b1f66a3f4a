//! Sweep axes and their values, the grid of points, shards, and the `--set` overrides of a
//! point.

use serde::Serialize;
use thiserror::Error;

/// A bad axis or shard: names the argument and what is wrong.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SweepError {
    #[error("--vary {arg}: {reason}")]
    Axis { arg: String, reason: String },
    #[error("--shard {arg}: {reason}")]
    Shard { arg: String, reason: String },
    #[error("the grid has {points} points ({sizes}); at most {MAX_POINTS}: split the study into several sweeps")]
    Grid { points: String, sizes: String },
}

/// The most points one sweep may have: each is a whole simulation (about a second), so a million
/// is days of work; a larger grid is almost always a typo in a range.
pub const MAX_POINTS: u64 = 1_000_000;

/// The number of points of the grid over `axes`, checked against [`MAX_POINTS`] before anything
/// is allocated.
pub fn grid_size(axes: &[Axis]) -> Result<usize, SweepError> {
    let sizes = || {
        axes.iter()
            .map(|a| format!("{} x {}", a.values.len(), a.path))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let points = axes
        .iter()
        .try_fold(1u64, |n, a| n.checked_mul(a.values.len() as u64));
    match points {
        Some(n) if n <= MAX_POINTS => Ok(n as usize),
        Some(n) => Err(SweepError::Grid {
            points: n.to_string(),
            sizes: sizes(),
        }),
        None => Err(SweepError::Grid {
            points: "more than 2^64".into(),
            sizes: sizes(),
        }),
    }
}

/// One varied field and its values (as `--set` text).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Axis {
    pub path: String,
    pub values: Vec<String>,
}

fn axis_err(arg: &str, reason: impl Into<String>) -> SweepError {
    SweepError::Axis {
        arg: arg.to_string(),
        reason: reason.into(),
    }
}

impl Axis {
    /// Parses `PATH=VALUES`.
    pub fn parse(arg: &str) -> Result<Axis, SweepError> {
        let (path, spec) = arg.split_once('=').ok_or_else(|| {
            axis_err(
                arg,
                "expected PATH=VALUES, e.g. decode.max_num_seqs=16..64:16",
            )
        })?;
        let path = path.trim();
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(axis_err(arg, "empty field path"));
        }
        let values = parse_values(spec).map_err(|r| axis_err(arg, r))?;
        Ok(Axis {
            path: path.to_string(),
            values,
        })
    }
}

fn parse_values(spec: &str) -> Result<Vec<String>, String> {
    let spec = spec.trim();
    if let Some((a, rest)) = spec.split_once("..") {
        let (b, step) = match rest.split_once(':') {
            Some((b, s)) => (b, s),
            None => (rest, "1"),
        };
        let num = |s: &str, what: &str| {
            s.trim()
                .parse::<i64>()
                .map_err(|_| format!("{what} '{s}' is not an integer"))
        };
        let (a, b, step) = (num(a, "start")?, num(b, "end")?, num(step, "step")?);
        // In i128: the span and the values of a range near the ends of i64 overflow i64.
        let (a, b, step) = (i128::from(a), i128::from(b), i128::from(step));
        if step <= 0 {
            return Err(format!("step must be positive, got {step}"));
        }
        if b < a {
            return Err(format!("range {a}..{b} is empty"));
        }
        if (b - a) / step >= 10_000 {
            return Err("more than 10,000 values".into());
        }
        return Ok((0..)
            .map(|i| a + i * step)
            .take_while(|v| *v <= b)
            .map(|v| v.to_string())
            .collect());
    }
    let values: Vec<String> = spec.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(String::is_empty) {
        return Err("empty value in the list".into());
    }
    Ok(values)
}

/// One point of the grid: its index, a stable id, and the value of each axis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Point {
    pub index: u64,
    /// Hash of the varied values: the key a resumed sweep skips finished points by.
    pub id: String,
    pub values: Vec<String>,
}

/// The cartesian product of the axes, the last axis varying fastest.
pub fn grid(axes: &[Axis]) -> Result<Vec<Point>, SweepError> {
    let total = grid_size(axes)?;
    Ok((0..total)
        .map(|index| {
            let mut rem = index;
            let mut values = vec![String::new(); axes.len()];
            for (k, a) in axes.iter().enumerate().rev() {
                values[k] = a.values[rem % a.values.len()].clone();
                rem /= a.values.len();
            }
            Point {
                index: index as u64,
                id: point_id(axes, &values),
                values,
            }
        })
        .collect())
}

fn point_id(axes: &[Axis], values: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (a, v) in axes.iter().zip(values) {
        for b in a.path.bytes().chain([b'=']).chain(v.bytes()).chain([b';']) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// `k/n`: the points whose index is k modulo n (k counts from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub k: u64,
    pub n: u64,
}

impl Shard {
    pub fn parse(arg: &str) -> Result<Shard, SweepError> {
        let err = |r: &str| SweepError::Shard {
            arg: arg.to_string(),
            reason: r.to_string(),
        };
        let (k, n) = arg
            .split_once('/')
            .ok_or_else(|| err("expected K/N, e.g. 0/4"))?;
        let k: u64 = k.trim().parse().map_err(|_| err("K is not a number"))?;
        let n: u64 = n.trim().parse().map_err(|_| err("N is not a number"))?;
        if n == 0 || k >= n {
            return Err(err("need 0 <= K < N"));
        }
        Ok(Shard { k, n })
    }

    pub fn contains(&self, p: &Point) -> bool {
        p.index % self.n == self.k
    }
}

/// The `--set` overrides of a point, shorthands expanded against the base scenario's instance
/// names.
pub fn overrides(axes: &[Axis], values: &[String], instances: &[String]) -> Vec<String> {
    let mut sets = Vec::new();
    for (a, v) in axes.iter().zip(values) {
        let parts: Vec<&str> = a.path.split('.').collect();
        match parts.as_slice() {
            [name, "ep"] if instances.iter().any(|i| i == name) => {
                sets.push(format!("{name}.dies={v}"));
                sets.push(format!("{name}.ep={v}"));
            }
            [name, "instances"] if instances.iter().any(|i| i == name) => {
                sets.push(format!("{name}.count={v}"));
            }
            ["eplb", "redundant"] => {
                for i in instances {
                    sets.push(format!("{i}.redundant_experts={v}"));
                }
            }
            _ => sets.push(format!("{}={v}", a.path)),
        }
    }
    sets
}

/// The instance names of a scenario text (for shorthands), in file order.
pub fn instance_names(text: &str) -> Vec<String> {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("instance").and_then(|v| v.as_array().cloned()))
        .unwrap_or_default()
        .iter()
        .filter_map(|i| {
            i.get("name")
                .and_then(toml::Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_lists_and_ranges() {
        let a = Axis::parse("decode.max_num_seqs=16..64:16").unwrap();
        assert_eq!(a.values, ["16", "32", "48", "64"]);
        assert_eq!(
            Axis::parse("prefill.instances=2..4").unwrap().values,
            ["2", "3", "4"]
        );
        assert_eq!(
            Axis::parse("mtp.tokens=0, 1,2").unwrap().values,
            ["0", "1", "2"]
        );
        assert_eq!(
            Axis::parse("eplb.policy=greedy,global")
                .unwrap()
                .values
                .len(),
            2
        );
        for bad in [
            "x",
            "=1",
            "a.b=",
            "a.b=1,,2",
            "a.b=5..1",
            "a.b=1..9:0",
            "a..b=1",
        ] {
            assert!(Axis::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn grid_is_the_cartesian_product_last_axis_fastest() {
        let axes = vec![
            Axis::parse("a=1,2").unwrap(),
            Axis::parse("b=x,y,z").unwrap(),
        ];
        let g = grid(&axes).unwrap();
        assert_eq!(g.len(), 6);
        assert_eq!(g[0].values, ["1", "x"]);
        assert_eq!(g[1].values, ["1", "y"]);
        assert_eq!(g[3].values, ["2", "x"]);
        let ids: std::collections::BTreeSet<_> = g.iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids.len(), 6, "distinct ids");
        assert_eq!(grid(&axes).unwrap(), g, "deterministic");
    }

    #[test]
    fn shorthands_expand_against_instance_names() {
        let axes = vec![
            Axis::parse("decode.ep=64").unwrap(),
            Axis::parse("prefill.instances=3").unwrap(),
            Axis::parse("eplb.redundant=16").unwrap(),
            Axis::parse("mtp.tokens=2").unwrap(),
        ];
        let v: Vec<String> = axes.iter().map(|a| a.values[0].clone()).collect();
        let names = vec!["prefill".to_string(), "decode".to_string()];
        assert_eq!(
            overrides(&axes, &v, &names),
            [
                "decode.dies=64",
                "decode.ep=64",
                "prefill.count=3",
                "prefill.redundant_experts=16",
                "decode.redundant_experts=16",
                "mtp.tokens=2"
            ]
        );
    }

    proptest! {
        #[test]
        fn shards_cover_the_grid_exactly_once(sizes in prop::collection::vec(1usize..5, 1..4), n in 1u64..7) {
            let axes: Vec<Axis> = sizes
                .iter()
                .enumerate()
                .map(|(i, s)| Axis { path: format!("a{i}"), values: (0..*s).map(|v| v.to_string()).collect() })
                .collect();
            let g = grid(&axes).unwrap();
            let mut seen = vec![0; g.len()];
            for k in 0..n {
                let sh = Shard { k, n };
                for p in g.iter().filter(|p| sh.contains(p)) {
                    seen[p.index as usize] += 1;
                }
            }
            prop_assert!(seen.iter().all(|c| *c == 1));
        }
    }
}
