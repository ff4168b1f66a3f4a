//! What-if sweeps: a grid of scenario overrides, the result row of each point, sharding, and
//! Pareto fronts. IO-free: the CLI reads and writes files and runs points in parallel.
//!
//! An axis is `PATH=VALUES` where PATH is anything `--set` accepts (docs/scenarios.md), plus
//! shorthands: `NAME.ep` (expert-parallel size; an instance's EP spans its dies, so it sets both
//! `dies` and `ep`), `NAME.instances` (= `count`), `eplb.redundant` (redundant experts of every
//! instance). VALUES is a comma list (`16,32,64`, `true,false`, `greedy,global`), an inclusive
//! integer range `2..8`, or a stepped one `16..128:16`.
//!
//! - `grid`: axes, the grid of points, shards, and each point's `--set` overrides.
//! - `rows`: running a point into its result row; rows as CSV, written and read back.
//! - `front`: Pareto fronts, their knee and their plots.
//! - `summary`: the markdown summary of a sweep.

mod front;
mod grid;
mod rows;
mod summary;

pub use front::{front_plot, fronts, knee, pareto, Front};
pub use grid::{
    grid, grid_size, instance_names, overrides, Axis, Point, Shard, SweepError, MAX_POINTS,
};
pub use rows::{
    csv_header, csv_record, label, one_line, read_csv, run_point, write_csv, CsvError, Row, METRICS,
};
pub use summary::summary_markdown;
