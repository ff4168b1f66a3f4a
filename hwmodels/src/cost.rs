//! The cost model: prices a unit of compute work on a chip (roofline times an efficiency per op
//! class) and a collective on the fabric level its group spans (latency, bandwidth, group size).
//!
//! Parameters come from a cost data file (`data/costs/*.toml`) with the source of every number;
//! nothing here hides a constant.

use crate::dtype::DType;
use crate::error::{check_range, invalid, HwError};
use crate::system::{FabricLevel, Scope, System};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Kinds of compute op that get their own efficiency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// Dense matrix multiplies (projections, dense FFN, LM head).
    Gemm,
    /// Grouped expert GEMMs of the MoE layers.
    GroupedGemm,
    /// Grouped expert GEMMs of a tensor-parallel MoE: every die computes every expert over a
    /// slice of its intermediate (on GPUs the fused Triton MoE kernel, not DeepGEMM's); a cost
    /// file without its own entry uses `grouped_gemm`'s.
    TpGroupedGemm,
    /// Attention core (QK, softmax, AV) of decode steps: MLA over the latent cache.
    Attention,
    /// Attention core of prompt tokens (flash attention over up-projected K and V): a
    /// different kernel from decode's; a cost file without its own entry uses `attention`'s.
    PrefillAttention,
    /// Sparse-attention indexers (DeepSeek-V3.2 DSA, V4 compressed attention).
    Indexer,
    /// Norms, activations, rotary, routing top-k, sampling: memory-bound glue.
    Elementwise,
}

impl OpClass {
    pub const ALL: [OpClass; 7] = [
        OpClass::Gemm,
        OpClass::GroupedGemm,
        OpClass::TpGroupedGemm,
        OpClass::Attention,
        OpClass::PrefillAttention,
        OpClass::Indexer,
        OpClass::Elementwise,
    ];
    /// The class whose efficiency a cost file without an entry of this class's own prices it
    /// with; `None` for classes every cost file must give.
    pub fn fallback(self) -> Option<OpClass> {
        match self {
            OpClass::PrefillAttention => Some(OpClass::Attention),
            OpClass::TpGroupedGemm => Some(OpClass::GroupedGemm),
            _ => None,
        }
    }

    /// Position in [`OpClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            OpClass::Gemm => "gemm",
            OpClass::GroupedGemm => "grouped_gemm",
            OpClass::TpGroupedGemm => "tp_grouped_gemm",
            OpClass::Attention => "attention",
            OpClass::PrefillAttention => "prefill_attention",
            OpClass::Indexer => "indexer",
            OpClass::Elementwise => "elementwise",
        }
    }
}

/// Collective operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    /// MoE dispatch: tokens to the dies holding their experts.
    Dispatch,
    /// MoE combine: expert outputs back to their tokens' dies.
    Combine,
    /// Point-to-point transfer (e.g. KV cache from prefill to decode).
    P2p,
}

impl CommKind {
    /// Every collective kind.
    pub const ALL: [CommKind; 6] = [
        CommKind::AllReduce,
        CommKind::AllGather,
        CommKind::ReduceScatter,
        CommKind::Dispatch,
        CommKind::Combine,
        CommKind::P2p,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CommKind::AllReduce => "all_reduce",
            CommKind::AllGather => "all_gather",
            CommKind::ReduceScatter => "reduce_scatter",
            CommKind::Dispatch => "dispatch",
            CommKind::Combine => "combine",
            CommKind::P2p => "p2p",
        }
    }
}

/// All-to-all implementations: latency-optimized (decode; DeepEP low-latency, MC2) or
/// throughput-optimized (prefill; DeepEP normal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum A2aMode {
    LowLatency,
    Normal,
}

/// How one op class performs as a function of its shape: achieved fractions of peak when
/// compute-bound and memory-bound, the rows a kernel computes whatever its shape asks (tile
/// padding of small-M matrices), and a fixed cost per kernel.
///
/// An op of `F` FLOPs, `B` HBM bytes and `R` rows (the GEMM M dimension: tokens for dense
/// GEMMs, tokens per expert for grouped GEMMs, query rows for attention) takes
/// `fixed_us + max(F / (peak x compute) x (R + rows_pad) / R, B / (HBM x memory))`; an op of at
/// most one row with [`Efficiency::one_row`] given takes that entry's form instead (no padding).
/// An op split `S` wide by tensor parallelism ([`Work::slice`]) computes `(S + slice_pad) / S`
/// times longer again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    pub compute: f64,
    pub memory: f64,
    /// Rows added to every op's own by tile padding: a GEMM of 4 tokens on a 16-row tile
    /// computes as if it had 16 rows, which `rows_pad` = 12 averages. 0: no such effect.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows_pad: f64,
    /// Width added to a tensor-parallel op's slice ([`Work::slice`]) by the work its kernel
    /// does whatever the slice (tile prologue and epilogue, the output written per tile): a
    /// MoE expert split 8 ways computes its 256-wide slice as if it were `256 + slice_pad`
    /// wide. 0: no such effect.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slice_pad: f64,
    /// Memory efficiency of this class's kernels that compute from int4 weights
    /// ([`Work::dtype`] int4: W4A8's grouped matmul, which unpacks them to int8 on the way).
    /// Absent: `memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int4_memory: Option<f64>,
    /// Fixed cost of one kernel of this class, µs: launch, pipeline fill and drain, the
    /// synchronization ending it. Absent: the file's `op_overhead_us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_us: Option<f64>,
    pub source: String,
    /// Kernels of at most one row (a matrix-vector product: one sequence's decode step; the
    /// fraction of a row sparse expert parallelism expects per expert) where the
    /// engine runs them as another kernel than wider ones (a GEMV path): their own
    /// efficiencies and fixed cost. Absent: priced as every other op of the class. Fitted by
    /// `calibrate --trace` where a trace holds enough of both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_row: Option<OneRow>,
}

/// The one-row form of an op class ([`Efficiency::one_row`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OneRow {
    pub compute: f64,
    pub memory: f64,
    pub fixed_us: f64,
}

impl OneRow {
    /// Whether an op of `rows` rows takes the one-row form: at most one row (one, or the
    /// fraction sparse expert parallelism expects per expert), more than none.
    pub fn covers(rows: f64) -> bool {
        rows > 0.0 && rows <= 1.0
    }
}

/// Largest `[host] step_sigma` a cost file may give: a step's deciles at 0.28 and 3.6 times its
/// price; more is a trace of something else than steps.
pub const MAX_STEP_SIGMA: f64 = 1.0;

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Which resource bound a kernel in its microbenchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Compute,
    Memory,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Compute => "compute",
            Resource::Memory => "memory",
        }
    }
}

/// A fused kernel priced by its own microbenchmarks rather than by its op class: the ops (by
/// the op graph's names) it covers, its fixed cost per call, and the efficiency of the resource
/// that bound it in the microbenchmarks; the other resource keeps the op class's efficiency.
/// Microbenchmarks time a kernel alone, so the fixed cost holds no launch gap; the class's
/// fixed cost (`op_overhead_us`, fitted to whole steps) does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelParams {
    /// Op names, e.g. "hc_pre" or "c4a".
    pub ops: Vec<String>,
    /// Fixed cost of one call, µs.
    pub fixed_us: f64,
    /// The resource whose efficiency the microbenchmarks give.
    pub bound: Resource,
    /// Achieved fraction of that resource's peak.
    pub efficiency: f64,
    pub source: String,
}

/// Host (CPU) time of one engine step, outside the device's kernels: scheduling, input
/// preparation, graph launch, output processing. Synchronous scheduling adds it to every step;
/// asynchronous scheduling hides it behind the device step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostParams {
    /// Per step, µs.
    pub step_us: f64,
    /// Per scheduled sequence, µs.
    #[serde(default)]
    pub per_seq_us: f64,
    /// Per token the step computes, µs (input preparation and the glue between kernels that
    /// grow with the batch).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub per_token_us: f64,
    /// Front-end time per request, µs: between a client and the engine (HTTP, tokenizing,
    /// streaming back), on every request's TTFT and end-to-end latency. A scenario's
    /// `frontend_us` overrides it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub request_us: f64,
    /// A step that starts more than this long after the device's previous step ended (it
    /// idled), µs, runs its kernels [`HostParams::cold_factor`] times their warm time: caches
    /// and clocks went cold while the device waited. Both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_after_us: Option<f64>,
    /// Kernel time of a step after idling over the same step's warm time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_factor: Option<f64>,
    /// Spread of a step's kernel time around its price: the standard deviation of its natural
    /// log. The twin draws each step's kernel time as its price times a lognormal factor of
    /// mean 1 with this spread (seeded, independent from step to step), so that latency
    /// percentiles carry the variation a real device shows. 0 or absent: every step at its price.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub step_sigma: f64,
    /// Host time to launch one model layer's kernels one by one, µs: what a step that runs
    /// eagerly (no captured graph) spends on the CPU per layer. The device runs behind the
    /// launches, so an eager step takes the longer of its kernels' time and its launches'. 0 or
    /// absent: not priced.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub eager_layer_us: f64,
    pub source: String,
}

/// MoE all-to-all parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllToAllParams {
    /// Fixed cost of a dispatch (routing metadata, quantization, synchronization), µs.
    pub dispatch_base_us: f64,
    /// Fixed cost of a combine, µs.
    pub combine_base_us: f64,
    /// Added per doubling of the EP group size, µs.
    pub per_doubling_us: f64,
    /// Low-latency mode: achieved fraction of the level's bandwidth.
    pub low_latency_bw_eff: f64,
    /// Low-latency kernels that always use the outermost (RDMA) level, even inside a node (DeepEP).
    #[serde(default)]
    pub low_latency_uses_outer_level: bool,
    /// Normal mode, dispatch (and combine unless the combine pair below is given): achieved
    /// fraction of the level's bandwidth at EP8.
    pub normal_bw_eff_at_ep8: f64,
    /// Normal mode: change of that fraction per doubling of EP beyond 8 (negative: it falls).
    pub normal_bw_eff_per_doubling: f64,
    /// Normal-mode combine's own fraction at EP8, where its kernel scales differently from
    /// dispatch's (given together with `normal_combine_bw_eff_per_doubling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normal_combine_bw_eff_at_ep8: Option<f64>,
    /// Normal-mode combine's change per doubling of EP beyond 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normal_combine_bw_eff_per_doubling: Option<f64>,
    /// Normal mode: the fraction never falls below this.
    pub normal_bw_eff_min: f64,
    /// Names of the fabric levels the microbenchmarks these parameters were fitted to ran on
    /// (e.g. "HCCS", "UB"): a dispatch or combine priced on any other level is an
    /// extrapolation, and reports say so.
    #[serde(default)]
    pub fitted_on: Vec<String>,
    /// Time factor on a dispatch or combine priced on a level not in `fitted_on` (an
    /// extrapolation): 1 prices the fitted form as it is; the uncertainty draws move it.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub unfitted_factor: f64,
    pub source: String,
}

fn is_one(v: &f64) -> bool {
    *v == 1.0
}

impl AllToAllParams {
    /// Normal mode: the achieved fraction of the level's bandwidth of a dispatch or combine
    /// (`kind`; other kinds take dispatch's) in a group of `group` dies.
    pub fn normal_bw_eff(&self, kind: CommKind, group: u32) -> f64 {
        let (at_ep8, per_doubling) = match (
            kind,
            self.normal_combine_bw_eff_at_ep8,
            self.normal_combine_bw_eff_per_doubling,
        ) {
            (CommKind::Combine, Some(a), Some(d)) => (a, d),
            _ => (self.normal_bw_eff_at_ep8, self.normal_bw_eff_per_doubling),
        };
        (at_ep8 + per_doubling * (group as f64 / 8.0).log2()).clamp(self.normal_bw_eff_min, 1.0)
    }
}

/// Ring collectives (all-reduce, all-gather, reduce-scatter) and point-to-point transfers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveParams {
    /// Fixed cost per collective call, µs (added to the level's latency).
    pub base_us: f64,
    /// Achieved fraction of the level's bandwidth.
    pub bw_eff: f64,
    pub source: String,
}

/// A cost-model parameter file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostParams {
    pub name: String,
    /// The cost model this file's missing numbers come from (a catalog name): the file gives
    /// only what differs, and every other number stays what that model's file (and its fit)
    /// says. Kept after loading, so that reports can say where borrowed numbers come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherits: Option<String>,
    pub source: String,
    /// Fixed cost per kernel in graph mode, µs, for classes that give no `fixed_us` of their own.
    pub op_overhead_us: f64,
    /// Fraction of their isolated-microbenchmark efficiency that kernels reach inside a full
    /// model step (shapes, cache and core contention); multiplies every class's efficiencies.
    /// 1.0 (the default) where the classes' own efficiencies are in-step figures.
    #[serde(default = "one")]
    pub in_situ_efficiency: f64,
    /// How close two-micro-batch overlap comes to its best case (1.0) from running the two halves
    /// one after the other (0.0), in steps whose all-to-all runs in low-latency mode (decode).
    pub overlap_efficiency_low_latency: f64,
    /// The same in steps whose all-to-all runs in normal mode (prefill, mixed steps with
    /// prompts): the bulk transfers take vector cores and HBM from the other micro-batch.
    pub overlap_efficiency_normal: f64,
    /// Per op class; every class must be present.
    pub efficiency: BTreeMap<OpClass, Efficiency>,
    pub alltoall: AllToAllParams,
    pub collective: CollectiveParams,
    /// Host time per step (absent: none, or what a scenario gives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostParams>,
    /// The parameters `dstwin calibrate` fits to the end-to-end anchors (names such as
    /// "op_overhead_us" or "efficiency.attention.compute"); every other number is read from a
    /// microbenchmark or is an assumption, as its comment says.
    #[serde(default)]
    pub fit: Vec<String>,
    /// Fused kernels with microbenchmarks of their own (absent: every op is priced by its
    /// class).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel: Vec<KernelParams>,
}

fn one() -> f64 {
    1.0
}

/// An efficiency: a share of a peak, at least 1e-9 (a trace of a debug build on a CPU's nominal
/// peak fits 1e-5; far smaller shares overflow prices).
fn check_frac(file: &str, field: String, v: f64) -> Result<(), HwError> {
    check_range(file, field, v, (1e-9, 1.0), "in [1e-9, 1]")
}

/// A fixed cost or count: 0 up to a billion (µs: about 17 minutes).
fn check_nonneg(file: &str, field: &str, v: f64) -> Result<(), HwError> {
    check_range(file, field, v, (0.0, 1e9), "a number from 0 to 1e9")
}

/// `v` must be a finite number above 0; `meaning` says what it is in the error.
fn check_positive(file: &str, field: &str, v: f64, meaning: &str) -> Result<(), HwError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(invalid(
            file,
            field,
            v,
            &format!("must be a number > 0 ({meaning})"),
        ))
    }
}

impl CostParams {
    /// The efficiency of an op class (prefill attention falls back to attention's, the
    /// tensor-parallel grouped GEMM to the grouped GEMM's).
    pub fn efficiency(&self, class: OpClass) -> &Efficiency {
        match self.efficiency.get(&class) {
            Some(e) => e,
            None => &self.efficiency[&class.fallback().unwrap_or(class)],
        }
    }

    /// The kernel entry that prices the op named `op`, if any.
    pub fn kernel(&self, op: &str) -> Option<&KernelParams> {
        self.kernel.iter().find(|k| k.ops.iter().any(|o| o == op))
    }

    /// Two-micro-batch overlap efficiency of steps whose all-to-all runs in `mode`.
    pub fn overlap_efficiency(&self, mode: A2aMode) -> f64 {
        match mode {
            A2aMode::LowLatency => self.overlap_efficiency_low_latency,
            A2aMode::Normal => self.overlap_efficiency_normal,
        }
    }

    pub fn validate(&self, file: &str) -> Result<(), HwError> {
        check_nonneg(file, "op_overhead_us", self.op_overhead_us)?;
        check_frac(file, "in_situ_efficiency".into(), self.in_situ_efficiency)?;
        for (field, v) in [
            (
                "overlap_efficiency_low_latency",
                self.overlap_efficiency_low_latency,
            ),
            ("overlap_efficiency_normal", self.overlap_efficiency_normal),
        ] {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(invalid(file, field, v, "must be in [0, 1]"));
            }
        }
        for c in OpClass::ALL {
            if c.fallback().is_some() && !self.efficiency.contains_key(&c) {
                continue;
            }
            let e = self.efficiency.get(&c).ok_or_else(|| {
                invalid(
                    file,
                    format!("efficiency.{}", c.name()),
                    "(missing)",
                    "every op class needs an efficiency",
                )
            })?;
            check_frac(file, format!("efficiency.{}.compute", c.name()), e.compute)?;
            check_frac(file, format!("efficiency.{}.memory", c.name()), e.memory)?;
            check_nonneg(
                file,
                &format!("efficiency.{}.rows_pad", c.name()),
                e.rows_pad,
            )?;
            check_nonneg(
                file,
                &format!("efficiency.{}.slice_pad", c.name()),
                e.slice_pad,
            )?;
            if let Some(m) = e.int4_memory {
                check_frac(file, format!("efficiency.{}.int4_memory", c.name()), m)?;
            }
            if let Some(f) = e.fixed_us {
                check_nonneg(file, &format!("efficiency.{}.fixed_us", c.name()), f)?;
            }
            if let Some(o) = &e.one_row {
                let f = |x: &str| format!("efficiency.{}.one_row.{x}", c.name());
                check_frac(file, f("compute"), o.compute)?;
                check_frac(file, f("memory"), o.memory)?;
                check_nonneg(file, &f("fixed_us"), o.fixed_us)?;
            }
        }
        if let Some(h) = &self.host {
            check_nonneg(file, "host.step_us", h.step_us)?;
            check_nonneg(file, "host.per_seq_us", h.per_seq_us)?;
            check_nonneg(file, "host.eager_layer_us", h.eager_layer_us)?;
            check_nonneg(file, "host.per_token_us", h.per_token_us)?;
            check_nonneg(file, "host.request_us", h.request_us)?;
            if !(h.step_sigma.is_finite() && (0.0..=MAX_STEP_SIGMA).contains(&h.step_sigma)) {
                return Err(invalid(
                    file,
                    "host.step_sigma",
                    h.step_sigma,
                    &format!("must be a number from 0 to {MAX_STEP_SIGMA} (the standard deviation of the log of a step's kernel time over its price)"),
                ));
            }
            match (h.cold_after_us, h.cold_factor) {
                (None, None) => {}
                (Some(after), Some(factor)) => {
                    check_positive(
                        file,
                        "host.cold_after_us",
                        after,
                        "the idle time after which a step starts cold",
                    )?;
                    check_range(
                        file,
                        "host.cold_factor",
                        factor,
                        (1e-3, 1e3),
                        "0.001 to 1,000 (a cold step's kernel time over its warm time)",
                    )?;
                }
                (Some(v), None) | (None, Some(v)) => {
                    let (given, missing) = if h.cold_after_us.is_some() {
                        ("host.cold_after_us", "host.cold_factor")
                    } else {
                        ("host.cold_factor", "host.cold_after_us")
                    };
                    return Err(invalid(
                        file,
                        given,
                        v,
                        &format!("needs {missing} too (a cold step is told by both)"),
                    ));
                }
            }
        }
        let a = &self.alltoall;
        check_nonneg(file, "alltoall.dispatch_base_us", a.dispatch_base_us)?;
        check_nonneg(file, "alltoall.combine_base_us", a.combine_base_us)?;
        check_nonneg(file, "alltoall.per_doubling_us", a.per_doubling_us)?;
        check_range(
            file,
            "alltoall.unfitted_factor",
            a.unfitted_factor,
            (1e-3, 1e3),
            "0.001 to 1,000",
        )?;
        check_frac(
            file,
            "alltoall.low_latency_bw_eff".into(),
            a.low_latency_bw_eff,
        )?;
        check_frac(
            file,
            "alltoall.normal_bw_eff_at_ep8".into(),
            a.normal_bw_eff_at_ep8,
        )?;
        check_frac(
            file,
            "alltoall.normal_bw_eff_min".into(),
            a.normal_bw_eff_min,
        )?;
        if !a.normal_bw_eff_per_doubling.is_finite() {
            return Err(invalid(
                file,
                "alltoall.normal_bw_eff_per_doubling",
                a.normal_bw_eff_per_doubling,
                "must be a number",
            ));
        }
        match (
            a.normal_combine_bw_eff_at_ep8,
            a.normal_combine_bw_eff_per_doubling,
        ) {
            (None, None) => {}
            (Some(at), Some(d)) => {
                check_frac(file, "alltoall.normal_combine_bw_eff_at_ep8".into(), at)?;
                if !d.is_finite() {
                    return Err(invalid(
                        file,
                        "alltoall.normal_combine_bw_eff_per_doubling",
                        d,
                        "must be a number",
                    ));
                }
            }
            (Some(at), None) => {
                return Err(invalid(
                    file,
                    "alltoall.normal_combine_bw_eff_at_ep8",
                    at,
                    "give normal_combine_bw_eff_per_doubling with it",
                ));
            }
            (None, Some(d)) => {
                return Err(invalid(
                    file,
                    "alltoall.normal_combine_bw_eff_per_doubling",
                    d,
                    "give normal_combine_bw_eff_at_ep8 with it",
                ));
            }
        }
        check_nonneg(file, "collective.base_us", self.collective.base_us)?;
        check_frac(file, "collective.bw_eff".into(), self.collective.bw_eff)?;
        let mut named: Vec<&str> = Vec::new();
        for (i, k) in self.kernel.iter().enumerate() {
            let field = |f: &str| format!("kernel[{i}].{f}");
            if k.ops.is_empty() {
                return Err(invalid(file, field("ops"), "[]", "name at least one op"));
            }
            for op in &k.ops {
                if named.contains(&op.as_str()) {
                    return Err(invalid(
                        file,
                        field("ops"),
                        op,
                        "an op may have one kernel entry only",
                    ));
                }
                named.push(op);
            }
            check_nonneg(file, &field("fixed_us"), k.fixed_us)?;
            check_frac(file, field("efficiency"), k.efficiency)?;
        }
        Ok(())
    }
}

/// Which resource sets an op's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    Compute,
    Memory,
    Communication,
    /// Launch overhead exceeds both compute and memory time.
    Overhead,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Memory => "memory",
            Bound::Communication => "communication",
            Bound::Overhead => "overhead",
        }
    }
}

/// Compute work of one op on one die.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Work {
    pub class: OpClass,
    /// Floating-point (or integer) operations.
    pub flops: f64,
    /// HBM bytes read and written.
    pub bytes: f64,
    /// The format the kernel computes from, which sets the peak; int4 (weights unpacked to
    /// int8, priced at the int8 peak) selects the class's `int4_memory`.
    pub dtype: DType,
    /// Rows of the op's varying matrix side (tokens of a GEMM, tokens per expert of a grouped
    /// GEMM, query rows of attention); 0 when the op has none (tile padding then does not apply).
    pub rows: f64,
    /// Width of the slice tensor parallelism leaves each die of the op's split dimension (the
    /// expert intermediate per die of a tensor-parallel MoE); 0 when the op is not split that
    /// way ([`Efficiency::slice_pad`] then does not apply).
    #[serde(default)]
    pub slice: f64,
}

/// A collective as one die sees it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comm {
    pub kind: CommKind,
    /// Payload per die: for dispatch/combine the bytes it sends (local share included); for
    /// ring collectives the full tensor size; for p2p the bytes moved.
    pub bytes: f64,
    /// Dies in the group.
    pub group: u32,
    pub mode: A2aMode,
    /// Dispatch and combine: copies of each token the payload holds (top-k, plus one for a
    /// shared-expert die). Bulk (normal-mode) kernels send a token once to each other node that
    /// needs it and fan it out inside the node (DeepEP normal, MC2 hierarchical); 0 when
    /// unknown (no deduplication).
    pub copies: f64,
}

/// A priced op.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Seconds.
    pub time_s: f64,
    /// Seconds at the compute roofline (0 for communication).
    pub compute_s: f64,
    /// Seconds at the memory roofline (0 for communication).
    pub memory_s: f64,
    pub bound: Bound,
}

/// What pricing an op of one class reads, resolved once from [`CostParams`].
#[derive(Clone, Copy, Debug, PartialEq)]
struct ClassCost {
    compute: f64,
    memory: f64,
    rows_pad: f64,
    slice_pad: f64,
    /// Memory efficiency of ops computing from int4 weights.
    int4_memory: f64,
    fixed_s: f64,
    /// One-row kernels: compute, memory, fixed seconds.
    one_row: Option<(f64, f64, f64)>,
}

impl ClassCost {
    fn of(params: &CostParams, class: OpClass) -> Self {
        let e = params.efficiency(class);
        ClassCost {
            compute: e.compute,
            memory: e.memory,
            rows_pad: e.rows_pad,
            slice_pad: e.slice_pad,
            int4_memory: e.int4_memory.unwrap_or(e.memory),
            fixed_s: e.fixed_us.unwrap_or(params.op_overhead_us) * 1e-6,
            one_row: e.one_row.map(|o| (o.compute, o.memory, o.fixed_us * 1e-6)),
        }
    }
}

/// Prices work on one system with one parameter set.
///
/// What pricing reads on every op is resolved from `params` when the model is built: to price
/// with other parameters, build a new model (debug builds check that `params` was not changed
/// in place).
#[derive(Clone, Debug)]
pub struct CostModel {
    pub system: System,
    pub params: CostParams,
    /// Peak FLOP/s per die by format, resolved once (formats without a fast path fall back).
    peaks: [f64; DType::ALL.len()],
    /// Per op class ([`OpClass::index`]): efficiencies, padding and fixed cost.
    classes: [ClassCost; OpClass::ALL.len()],
    /// The op names kernel entries cover, each as its [`name_word`], with the entry: an op's
    /// entry is found by comparing words (most ops have none).
    kernel_ops: Vec<(u64, usize)>,
}

/// An op name's length and first seven bytes in one word: two names of at most seven bytes
/// are equal exactly when their words are; longer names with equal words are compared whole.
fn name_word(name: &str) -> u64 {
    let b = name.as_bytes();
    let mut w = [0u8; 8];
    let n = b.len().min(7);
    w[..n].copy_from_slice(&b[..n]);
    w[7] = b.len().min(255) as u8;
    u64::from_le_bytes(w)
}

impl CostModel {
    pub fn new(system: System, params: CostParams) -> Self {
        // Int4 work is int4 weights computed in int8 (W4A8's activations are int8): the int8
        // peak, whatever int4 rate a chip lists; the weights' format selects `int4_memory`.
        let peaks = DType::ALL.map(|d| {
            let math = if d == DType::Int4 { DType::Int8 } else { d };
            system.chip.peak_flops(math)
        });
        let classes = OpClass::ALL.map(|c| ClassCost::of(&params, c));
        let kernel_ops = params
            .kernel
            .iter()
            .enumerate()
            .flat_map(|(i, k)| k.ops.iter().map(move |op| (name_word(op), i)))
            .collect();
        CostModel {
            system,
            params,
            peaks,
            classes,
            kernel_ops,
        }
    }

    fn class(&self, class: OpClass) -> &ClassCost {
        let c = &self.classes[class.index()];
        debug_assert_eq!(
            *c,
            ClassCost::of(&self.params, class),
            "cost parameters changed in place after the model was built"
        );
        c
    }

    /// The kernel entry pricing the op named `op` ([`CostParams::kernel`]).
    fn kernel(&self, op: &str) -> Option<&KernelParams> {
        let w = name_word(op);
        let found = self
            .kernel_ops
            .iter()
            .filter(|(k, _)| *k == w)
            .map(|&(_, i)| &self.params.kernel[i])
            .find(|k| op.len() <= 7 || k.ops.iter().any(|o| o == op));
        debug_assert_eq!(found, self.params.kernel(op), "kernel entries changed");
        found
    }

    /// Peak FLOP/s per die for a format.
    pub fn peak_flops(&self, d: DType) -> f64 {
        self.peaks[d.index()]
    }

    /// Fixed cost of one kernel of `class`, seconds.
    pub fn fixed_s(&self, class: OpClass) -> f64 {
        self.class(class).fixed_s
    }

    /// Roofline time of `w` on one die: max(compute, memory) at the class's efficiency (compute
    /// on the rows tile padding makes the kernel compute), plus the class's fixed cost per
    /// kernel when the op does anything.
    pub fn compute(&self, w: &Work) -> Cost {
        let e = self.class(w.class);
        match e.one_row {
            Some((compute, memory, fixed_s)) if OneRow::covers(w.rows) => {
                self.roofline(w, compute, memory, (0.0, e.slice_pad), fixed_s)
            }
            _ => {
                let memory = if w.dtype == DType::Int4 {
                    e.int4_memory
                } else {
                    e.memory
                };
                self.roofline(w, e.compute, memory, (e.rows_pad, e.slice_pad), e.fixed_s)
            }
        }
    }

    /// [`CostModel::compute`] of the op named `op`: a kernel with its own entry
    /// ([`CostParams::kernel`]) is priced with that entry's fixed cost and efficiency (and its
    /// class's efficiency for the other resource, without row padding); any other op by its
    /// class.
    pub fn compute_op(&self, op: &str, w: &Work) -> Cost {
        let Some(k) = self.kernel(op) else {
            return self.compute(w);
        };
        let e = self.class(w.class);
        let (compute, memory) = match k.bound {
            Resource::Compute => (k.efficiency, e.memory),
            Resource::Memory => (e.compute, k.efficiency),
        };
        self.roofline(w, compute, memory, (0.0, 0.0), k.fixed_us * 1e-6)
    }

    /// `fixed_s` plus the slower of compute (with `pad`: rows of padding, width added to the
    /// slice) and memory time at the given efficiencies; nothing for an op with no work.
    fn roofline(
        &self,
        w: &Work,
        compute: f64,
        memory: f64,
        (rows_pad, slice_pad): (f64, f64),
        fixed_s: f64,
    ) -> Cost {
        let chip = &self.system.chip;
        let k = self.params.in_situ_efficiency;
        let grow = |n: f64, pad: f64| if n > 0.0 { (n + pad) / n } else { 1.0 };
        let padding = grow(w.rows, rows_pad) * grow(w.slice, slice_pad);
        let compute_s = w.flops * padding / (self.peaks[w.dtype.index()] * compute * k);
        let memory_s = w.bytes / (chip.hbm_bytes_per_s() * memory * k);
        let overhead_s = if w.flops > 0.0 || w.bytes > 0.0 {
            fixed_s
        } else {
            0.0
        };
        let roof = compute_s.max(memory_s);
        let bound = if overhead_s > roof {
            Bound::Overhead
        } else if compute_s >= memory_s {
            Bound::Compute
        } else {
            Bound::Memory
        };
        Cost {
            time_s: roof + overhead_s,
            compute_s,
            memory_s,
            bound,
        }
    }

    /// The fabric level a group of `dies` uses.
    pub fn level(&self, dies: u32) -> &FabricLevel {
        self.system.level_for(dies)
    }

    /// The level a dispatch or combine's slowest transfers cross.
    fn a2a_level(&self, c: &Comm) -> &FabricLevel {
        let outer =
            c.mode == A2aMode::LowLatency && self.params.alltoall.low_latency_uses_outer_level;
        if outer {
            self.system
                .fabric
                .last()
                .expect("validated: at least one level")
        } else {
            self.level(c.group.max(1))
        }
    }

    /// For a dispatch or combine priced on a fabric level its all-to-all parameters were not
    /// fitted on: that level's name (the price is an extrapolation).
    pub fn unfitted_level(&self, c: &Comm) -> Option<&str> {
        if !matches!(c.kind, CommKind::Dispatch | CommKind::Combine) || c.group <= 1 {
            return None;
        }
        let level = self.a2a_level(c);
        let fitted = &self.params.alltoall.fitted_on;
        (!fitted.contains(&level.name)).then_some(level.name.as_str())
    }

    /// Time of one collective as one die sees it. A group of one die costs nothing.
    pub fn comm(&self, c: &Comm) -> Cost {
        let g = c.group.max(1);
        if g == 1 || c.bytes <= 0.0 {
            return Cost {
                time_s: 0.0,
                compute_s: 0.0,
                memory_s: 0.0,
                bound: Bound::Communication,
            };
        }
        let a2a = matches!(c.kind, CommKind::Dispatch | CommKind::Combine);
        let level = if a2a {
            self.a2a_level(c)
        } else {
            self.level(g)
        };
        let bw = level.bw_gb_s_per_die * 1e9;
        let gf = g as f64;
        let lat = level.latency_us * 1e-6;
        let time_s = match c.kind {
            CommKind::Dispatch | CommKind::Combine => {
                let a = &self.params.alltoall;
                let base = if c.kind == CommKind::Dispatch {
                    a.dispatch_base_us
                } else {
                    a.combine_base_us
                };
                let eff = match c.mode {
                    A2aMode::LowLatency => a.low_latency_bw_eff,
                    A2aMode::Normal => a.normal_bw_eff(c.kind, g),
                };
                let fixed = lat + (base + a.per_doubling_us * gf.log2()) * 1e-6;
                let remote = c.bytes * (gf - 1.0) / gf;
                let t = fixed + self.a2a_transfer_s(c, level, remote, eff);
                match self.unfitted_level(c) {
                    None => t,
                    Some(_) => t * a.unfitted_factor,
                }
            }
            CommKind::AllReduce | CommKind::AllGather | CommKind::ReduceScatter | CommKind::P2p => {
                let p = &self.params.collective;
                let volume = match c.kind {
                    CommKind::AllReduce => 2.0 * (gf - 1.0) / gf * c.bytes,
                    CommKind::P2p => c.bytes,
                    _ => (gf - 1.0) / gf * c.bytes,
                };
                let steps = match c.kind {
                    CommKind::P2p => 1.0,
                    CommKind::AllReduce => 2.0 * gf.log2().ceil(),
                    _ => gf.log2().ceil(),
                };
                steps * lat + p.base_us * 1e-6 + volume / (bw * p.bw_eff)
            }
        };
        Cost {
            time_s,
            compute_s: 0.0,
            memory_s: 0.0,
            bound: Bound::Communication,
        }
    }

    /// Transfer time of `remote` bytes of a dispatch or combine on `level` at efficiency `eff`.
    /// A group spanning several nodes over a slower outer level sends over both at once, and
    /// the slower of the two sets the time (an outer level as fast as the node fabric is taken
    /// as the same plane, as CloudMatrix384's UB is). A bulk all-to-all sends each token once to every
    /// other node holding one of its experts and fans it out over the node fabric: the outer
    /// level carries the deduplicated copies, the node level all of them. Low-latency kernels
    /// send every copy straight to its die: the copies for dies of the same node go over the
    /// node fabric, the others over the outer level (unless the kernels route everything over
    /// the outer level, as DeepEP's do: then `level` is already that one and carries it all).
    fn a2a_transfer_s(&self, c: &Comm, level: &FabricLevel, remote: f64, eff: f64) -> f64 {
        let bw = level.bw_gb_s_per_die * 1e9;
        let per_node = self.system.dies_per_node().max(1);
        let inner = self
            .system
            .fabric
            .first()
            .expect("validated: at least one level");
        // A level as fast as the node's (the node level itself, or CloudMatrix384's UB) is the
        // same plane: one path.
        let slower = level.bw_gb_s_per_die < inner.bw_gb_s_per_die;
        let spans_nodes = c.group > per_node && level.scope > Scope::Node;
        if !spans_nodes || !slower {
            return remote / (bw * eff);
        }
        let inner_bw = inner.bw_gb_s_per_die * 1e9 * eff;
        if c.mode == A2aMode::LowLatency {
            if self.params.alltoall.low_latency_uses_outer_level {
                return remote / (bw * eff);
            }
            let g = c.group as f64;
            let local = (per_node as f64 - 1.0) / g * c.bytes;
            let outer = (g - per_node as f64) / g * c.bytes;
            return (outer / (bw * eff)).max(local / inner_bw);
        }
        if c.copies <= 1.0 {
            return remote / (bw * eff);
        }
        let nodes = (c.group as f64 / per_node as f64).ceil();
        // Expected other nodes among `copies` destinations spread evenly over the nodes.
        let other_nodes = (nodes - 1.0) * (1.0 - (1.0 - 1.0 / nodes).powf(c.copies));
        let per_copy = c.bytes / c.copies;
        let outer_s = per_copy * other_nodes / (bw * eff);
        let inner_s = remote / inner_bw;
        outer_s.max(inner_s)
    }
}
