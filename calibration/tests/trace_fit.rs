//! Fits from profiler traces: each fit recovers the parameters that generated its samples,
//! exactly without noise, within a tolerance with noise, and despite a few outliers; the mapping
//! of real and documented traces accounts for every kernel.

use dstwin_calibration::kernels::{
    detect_backend, map_kernels, summarize, Backend, OpKindName, RuleSet, Target,
};
use dstwin_calibration::tracefit::comm::{alpha_beta, fit_collective, CommSample, GroupKey};
use dstwin_calibration::tracefit::costfile::cost_file;
use dstwin_calibration::tracefit::efficiency::{
    fit_class, fit_class_with, fit_op, fit_split, ClassParams, Objective, Sample, MIN_OP_KERNELS,
};
use dstwin_calibration::tracefit::host::{check_host, fit_host, fit_host_pooled, StepSource};
use dstwin_calibration::tracefit::work::kernel_work;
use dstwin_calibration::tracefit::{calibrate, check, TraceOptions, DEFAULT_IDLE_FACTOR};
use dstwin_hwmodels::{
    A2aMode, Catalog, Comm, CommKind, CostModel, CostParams, DType, OpClass, Resource, Work,
};
use dstwin_traces::profile::{read_path, KernelRecord, Profile, ProfileFormat, StepMarker};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../traces/tests/data")
        .join(name)
}

const TRUTH: ClassParams = ClassParams {
    compute: 0.72,
    memory: 0.81,
    rows_pad: 48.0,
    fixed_us: 6.0,
};
const PRIOR: ClassParams = ClassParams {
    compute: 0.5,
    memory: 0.5,
    rows_pad: 0.0,
    fixed_us: 1.0,
};

/// GEMMs of every M from 1 to 8192 over a few weight shapes, bf16 on an H800-like chip: small
/// M memory-bound, large M compute-bound; times from `truth`, times `noise(i)`.
fn gemm_samples(truth: ClassParams, noise: impl Fn(usize) -> f64) -> Vec<Sample> {
    let mut v = Vec::new();
    for (i, m) in (0..14).map(|e| 1u32 << e).enumerate() {
        for (j, (k, n)) in [(7168.0, 1536.0), (7168.0, 2048.0), (2048.0, 7168.0)]
            .iter()
            .enumerate()
        {
            let m = f64::from(m);
            let mut s = Sample {
                flops: 2.0 * m * k * n,
                bytes: 2.0 * (m * k + k * n + m * n),
                rows: Some(m),
                peak_flops: 989e12,
                hbm_bytes_per_s: 3.35e12,
                time_us: 0.0,
            };
            s.time_us = truth.time_us(&s) * noise(i * 3 + j);
            v.push(s);
        }
    }
    v
}

fn close(got: f64, want: f64, rel: f64) -> bool {
    (got / want - 1.0).abs() <= rel
}

#[test]
fn the_efficiency_fit_recovers_exact_parameters() {
    let f = fit_class(&gemm_samples(TRUTH, |_| 1.0), PRIOR).unwrap();
    let p = f.params;
    assert!(close(p.compute, TRUTH.compute, 1e-6), "{p:?}");
    assert!(close(p.memory, TRUTH.memory, 1e-6), "{p:?}");
    assert!(close(p.rows_pad, TRUTH.rows_pad, 1e-5), "{p:?}");
    assert!(close(p.fixed_us, TRUTH.fixed_us, 1e-5), "{p:?}");
    assert!(f.rms_error < 1e-9, "{f:?}");
    assert!(f.compute_bound > 0 && f.memory_bound > 0);
    assert!(f.determined.compute && f.determined.memory && f.determined.rows_pad);
}

#[test]
fn the_efficiency_fit_tolerates_noise_and_outliers() {
    // 3% log-normal-ish noise, seeded.
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    let noise: Vec<f64> = (0..42)
        .map(|_| 1.0 + rng.random_range(-0.03..0.03))
        .collect();
    let f = fit_class(&gemm_samples(TRUTH, |i| noise[i]), PRIOR).unwrap();
    let p = f.params;
    assert!(close(p.compute, TRUTH.compute, 0.03), "{p:?}");
    assert!(close(p.memory, TRUTH.memory, 0.03), "{p:?}");
    assert!((p.rows_pad - TRUTH.rows_pad).abs() < 15.0, "{p:?}");
    assert!((p.fixed_us - TRUTH.fixed_us).abs() < 1.5, "{p:?}");
    assert!(f.rms_error < 0.03, "{f:?}");
    // Every seventh kernel twice as slow (contention the model does not see): the robust fit
    // keeps close to the truth and counts them.
    let f = fit_class(
        &gemm_samples(TRUTH, |i| if i % 7 == 3 { 2.0 } else { 1.0 }),
        PRIOR,
    )
    .unwrap();
    let p = f.params;
    assert!(close(p.compute, TRUTH.compute, 0.02), "{p:?}");
    assert!(close(p.memory, TRUTH.memory, 0.02), "{p:?}");
    assert!(f.outliers >= 5, "{f:?}");
}

#[test]
fn the_total_objective_adds_up_to_the_measured_time() {
    // Every seventh kernel twice as slow: the relative fit follows the typical kernel and
    // falls well short of the sum; the total fit, every kernel at its time's weight, comes
    // close (not exactly: its fixed cost sits at the bound 0 here, so its residuals need not
    // sum to zero).
    let samples = gemm_samples(TRUTH, |i| if i % 7 == 3 { 2.0 } else { 1.0 });
    let measured: f64 = samples.iter().map(|s| s.time_us).sum();
    let sum = |p: &ClassParams| samples.iter().map(|s| p.time_us(s)).sum::<f64>();
    let rel = fit_class_with(&samples, PRIOR, Objective::Relative).unwrap();
    let tot = fit_class_with(&samples, PRIOR, Objective::Total).unwrap();
    assert_eq!(rel, fit_class(&samples, PRIOR).unwrap());
    assert!(sum(&rel.params) < 0.97 * measured, "{rel:?}");
    let (r, t) = (sum(&rel.params) / measured, sum(&tot.params) / measured);
    assert!(
        (t - 1.0).abs() < 0.5 * (r - 1.0).abs(),
        "relative {r}, total {t}"
    );
    assert_eq!(tot.outliers, 0);
    // Without noise both recover the truth.
    let exact = fit_class_with(&gemm_samples(TRUTH, |_| 1.0), PRIOR, Objective::Total).unwrap();
    assert!(
        close(exact.params.compute, TRUTH.compute, 1e-6),
        "{exact:?}"
    );
    assert!(
        close(exact.params.fixed_us, TRUTH.fixed_us, 1e-5),
        "{exact:?}"
    );
    assert_eq!(Objective::parse("total"), Some(Objective::Total));
    assert_eq!(Objective::parse("mean"), None);
}

#[test]
fn one_row_kernels_get_their_own_form_when_they_run_another_kernel() {
    // The GEMMs of TRUTH from 2 rows up, and one-row GEMMs of 36 weight shapes that run a
    // matrix-vector kernel: memory-bound at 40% of the bandwidth with a 9 us fixed cost.
    let gemv = ClassParams {
        compute: 0.72,
        memory: 0.4,
        rows_pad: 0.0,
        fixed_us: 9.0,
    };
    let mut samples: Vec<Sample> = gemm_samples(TRUTH, |_| 1.0)
        .into_iter()
        .filter(|s| s.rows != Some(1.0))
        .collect();
    for k in [512.0, 1024.0, 2048.0, 4096.0, 7168.0, 8192.0] {
        for n in [256.0, 512.0, 1536.0, 2048.0, 4096.0, 7168.0] {
            let mut s = Sample {
                flops: 2.0 * k * n,
                bytes: 2.0 * (k + k * n + n),
                rows: None,
                peak_flops: 989e12,
                hbm_bytes_per_s: 3.35e12,
                time_us: 0.0,
            };
            s.time_us = gemv.time_us(&s);
            s.rows = Some(1.0);
            samples.push(s);
        }
    }
    let f = fit_split(&samples, PRIOR, Objective::Relative).unwrap();
    let one = f
        .one_row
        .as_ref()
        .expect("the one-row kernels fitted apart");
    assert_eq!(one.samples, 36);
    assert!(close(one.params.memory, 0.4, 1e-6), "{one:?}");
    assert!(close(one.params.fixed_us, 9.0, 1e-5), "{one:?}");
    // Memory-bound one-row kernels do not see the compute efficiency: the wider ones' stands.
    assert!(!one.determined.compute);
    assert!(close(f.main.params.compute, TRUTH.compute, 1e-6), "{f:?}");
    assert!(close(f.main.params.rows_pad, TRUTH.rows_pad, 1e-5), "{f:?}");
    assert!(f.rms_error < 1e-9 && f.rms_error_joint > 0.1, "{f:?}");
    // Kernels of one form everywhere: nothing is split off (it would not lower the error).
    let same: Vec<Sample> = samples
        .iter()
        .map(|s| Sample {
            time_us: TRUTH.time_us(s),
            ..*s
        })
        .collect();
    let f = fit_split(&same, PRIOR, Objective::Relative).unwrap();
    assert!(f.one_row.is_none(), "{f:?}");
    assert!(f.rms_error < 1e-6, "{f:?}");
    // Too few one-row kernels to fit apart (the 3 of gemm_samples, with the wider ones).
    let mut few: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.rows != Some(1.0))
        .collect();
    few.extend(samples.iter().filter(|s| s.rows == Some(1.0)).take(3));
    let f = fit_split(&few, PRIOR, Objective::Relative).unwrap();
    assert!(f.one_row.is_none());
}

#[test]
fn an_op_the_class_form_misses_gets_its_own() {
    // Elementwise kernels of 64 sizes: an op the class describes, and one three times slower
    // per element with a larger fixed cost (the CPU engine's norms against its activation).
    let class = ClassParams {
        compute: 0.02,
        memory: 0.5,
        rows_pad: 0.0,
        fixed_us: 3.0,
    };
    let ops = |p: ClassParams| -> Vec<Sample> {
        (1..=64)
            .map(|i| {
                let elems = 4096.0 * f64::from(i);
                let mut s = Sample {
                    flops: 4.0 * elems,
                    bytes: 4.0 * elems,
                    rows: None,
                    peak_flops: 157e9,
                    hbm_bytes_per_s: 204.8e9,
                    time_us: 0.0,
                };
                s.time_us = p.time_us(&s);
                s
            })
            .collect()
    };
    let slow = ClassParams {
        compute: class.compute / 3.0,
        fixed_us: 7.0,
        ..class
    };
    let like = ops(class);
    let unlike = ops(slow);
    for objective in Objective::ALL {
        let at_class = |s: &Sample| class.time_us(s);
        // The class's form fits the op exactly: nothing to gain.
        assert!(fit_op(&like, class, at_class, objective).is_none());
        let f = fit_op(&unlike, class, at_class, objective).expect("its own form");
        // FLOPs and bytes grow together here: either resource can carry the slower rate (the
        // other stays at the class's efficiency, as the cost model's [[kernel]] entry prices
        // it); the fixed cost and every time come back.
        assert!(close(f.form.fixed_us, 7.0, 1e-6), "{f:?}");
        assert!(f.error < 1e-6 * f.class_error, "{f:?}");
        assert_eq!(f.samples, 64);
        for x in &unlike {
            assert!(close(f.form.time_us(&class, x), x.time_us, 1e-6), "{f:?}");
        }
        let p = f.form.params(&class);
        match f.form.bound {
            Resource::Compute => {
                assert!(close(p.compute, slow.compute, 1e-6) && p.memory == class.memory)
            }
            Resource::Memory => assert_eq!(p.compute, class.compute),
        }
        assert_eq!(p.rows_pad, 0.0);
        // Too few kernels to tell.
        let few = &unlike[..MIN_OP_KERNELS - 1];
        assert!(fit_op(few, class, at_class, objective).is_none());
    }
}

#[test]
fn the_cost_file_carries_each_ops_own_form_as_a_kernel_entry() {
    // A calibration whose elementwise class gives `c4a` a form of its own; the A3 cost file
    // prices `c4a` with an entry shared with `c4li` and `c128a`: `c4a` leaves it, the others
    // keep it.
    let cat = Catalog::builtin();
    let cm = cat
        .cost_model(cat.system("atlas-800-a3").unwrap(), None)
        .unwrap();
    let opts = TraceOptions {
        backend: None,
        rules: RuleSet::default(),
        cost: Some(cm.clone()),
        idle_factor: DEFAULT_IDLE_FACTOR,
        dtype: None,
        model: None,
        objective: Objective::Total,
    };
    let mut cal = calibrate(&[], &opts);
    let samples: Vec<Sample> = gemm_samples(TRUTH, |_| 1.0);
    let report = cal
        .efficiency
        .iter_mut()
        .find(|r| r.class == OpClass::Elementwise)
        .unwrap();
    report.fit = fit_class(&samples, TRUTH);
    let class = report.fit.as_ref().unwrap().params;
    let own = ClassParams {
        compute: TRUTH.compute / 2.0,
        fixed_us: 9.0,
        rows_pad: 0.0,
        ..TRUTH
    };
    let slow: Vec<Sample> = samples
        .iter()
        .map(|x| Sample {
            rows: None,
            time_us: own.time_us(&Sample { rows: None, ..*x }),
            ..*x
        })
        .collect();
    let f = fit_op(&slow, class, |x| class.time_us(x), Objective::Total).expect("own form");
    report.ops = vec![("c4a".to_owned(), f.clone())];
    let text = cost_file(&cm.params, "mine", &cal).unwrap();
    let params: CostParams = toml::from_str(&text).unwrap();
    params.validate("mine").unwrap();
    let k = params.kernel("c4a").unwrap();
    assert_eq!(k.ops, ["c4a"]);
    assert_eq!(k.bound, f.form.bound);
    assert!(close(k.efficiency, f.form.efficiency, 1e-3));
    assert!(close(k.fixed_us, f.form.fixed_us, 1e-3));
    assert!(
        k.source.contains("apart from the elementwise class"),
        "{}",
        k.source
    );
    for op in ["c4li", "c128a"] {
        let (k, was) = (params.kernel(op).unwrap(), cm.params.kernel(op).unwrap());
        assert_eq!(k.ops, ["c4li", "c128a"]);
        assert_eq!(
            (k.fixed_us, k.bound, k.efficiency, &k.source),
            (was.fixed_us, was.bound, was.efficiency, &was.source)
        );
    }
}

#[test]
fn what_the_samples_cannot_see_keeps_the_prior() {
    // Only memory-bound kernels: compute and rows_pad are not determined.
    let small: Vec<Sample> = gemm_samples(TRUTH, |_| 1.0)
        .into_iter()
        .filter(|s| s.rows.unwrap() <= 4.0)
        .collect();
    let f = fit_class(&small, PRIOR).unwrap();
    assert!(
        !f.determined.compute && !f.determined.rows_pad && f.determined.memory,
        "{f:?}"
    );
    assert_eq!(f.params.compute, PRIOR.compute);
    assert_eq!(f.params.rows_pad, PRIOR.rows_pad);
    assert!(close(f.params.memory, TRUTH.memory, 1e-3), "{f:?}");
    // Two kernels of one compute-bound shape: time cannot split into a fixed part and a rate,
    // so fixed_us keeps the prior and compute takes the rest.
    let big: Vec<Sample> = gemm_samples(TRUTH, |_| 1.0)
        .into_iter()
        .filter(|s| s.rows == Some(8192.0) && s.flops == 2.0 * 8192.0 * 7168.0 * 1536.0)
        .collect();
    let twice = [big[0], big[0]];
    let f = fit_class(&twice, PRIOR).unwrap();
    assert!(
        !f.determined.fixed_us && !f.determined.rows_pad && f.determined.compute,
        "{f:?}"
    );
    assert_eq!(f.params.fixed_us, PRIOR.fixed_us);
    assert!(f.rms_error < 1e-9, "{f:?}");
    // No usable sample at all.
    assert!(fit_class(&[], PRIOR).is_none());
}

#[test]
fn alpha_beta_recovers_latency_and_bandwidth_per_group() {
    let mut samples = Vec::new();
    for (g, alpha, beta) in [(8u32, 12.0, 150.0), (16, 20.0, 40.0)] {
        for mb in [0.5, 1.0, 4.0, 16.0, 64.0] {
            let bytes = mb * 1e6;
            samples.push(CommSample {
                kind: CommKind::AllReduce,
                group: GroupKey::Size(g),
                bytes,
                time_us: alpha + bytes / (beta * 1e3),
            });
        }
    }
    // One message size: not fitted, mean reported.
    samples.push(CommSample {
        kind: CommKind::Dispatch,
        group: GroupKey::Name("ep".into()),
        bytes: 1e6,
        time_us: 80.0,
    });
    let fits = alpha_beta(&samples);
    assert_eq!(fits.len(), 3);
    let a8 = &fits[0];
    assert_eq!(a8.group, GroupKey::Size(8));
    assert!(
        close(a8.alpha_us.unwrap(), 12.0, 1e-9) && close(a8.beta_gb_s.unwrap(), 150.0, 1e-9),
        "{a8:?}"
    );
    assert!(
        close(fits[1].beta_gb_s.unwrap(), 40.0, 1e-9),
        "{:?}",
        fits[1]
    );
    let d = &fits[2];
    assert_eq!(
        (d.kind, d.sizes, d.alpha_us, d.mean_time_us),
        (CommKind::Dispatch, 1, None, 80.0)
    );
}

#[test]
fn the_collective_fit_recovers_the_cost_models_own_parameters() {
    let cat = Catalog::builtin();
    let cm = cat
        .cost_model(cat.system("nvidia-h800-8").unwrap(), None)
        .unwrap();
    let mut truth = cm.params.clone();
    truth.collective.base_us = 9.0;
    truth.collective.bw_eff = 0.62;
    let truth = CostModel::new(cm.system.clone(), truth);
    let mut samples = Vec::new();
    for (kind, g) in [
        (CommKind::AllReduce, 8u32),
        (CommKind::AllGather, 8),
        (CommKind::AllReduce, 16),
    ] {
        for mb in [1.0, 8.0, 64.0] {
            let c = Comm {
                kind,
                bytes: mb * 1e6,
                group: g,
                mode: A2aMode::Normal,
                copies: 0.0,
            };
            samples.push(CommSample {
                kind,
                group: GroupKey::Size(g),
                bytes: c.bytes,
                time_us: truth.comm(&c).time_s * 1e6,
            });
        }
    }
    let f = fit_collective(&samples, &cm).unwrap();
    assert!(
        close(f.base_us, 9.0, 1e-6) && close(f.bw_eff, 0.62, 1e-6),
        "{f:?}"
    );
    assert!(f.rms_error < 1e-9);
}

/// A profile of one device's steps: (start µs, duration µs, sequences).
fn steps(spans: &[(u64, u64, u64)]) -> Profile {
    let spans: Vec<(u64, u64, u64, Option<u64>)> =
        spans.iter().map(|&(a, b, c)| (a, b, c, None)).collect();
    steps_with_tokens(&spans)
}

/// Steps of (start µs, duration µs, sequences, tokens).
fn steps_with_tokens(spans: &[(u64, u64, u64, Option<u64>)]) -> Profile {
    Profile {
        origin: "synthetic".into(),
        format: ProfileFormat::ChromeJson,
        kernels: vec![],
        steps: spans
            .iter()
            .enumerate()
            .map(|(i, &(start, dur, seqs, tokens))| StepMarker {
                step: i as u64,
                device: Some(0),
                start_ns: start * 1000,
                dur_ns: dur * 1000,
                on_device: true,
                seqs: Some(seqs),
                tokens,
                line: 1,
            })
            .collect(),
        notes: Default::default(),
        skipped: Default::default(),
    }
}

/// Steps of 300 µs of (sequences, tokens), each after host time 20 + 5 per sequence + 2 per
/// token.
fn host_20_5_2(shapes: &[(u64, u64)]) -> Vec<(u64, u64, u64, Option<u64>)> {
    let mut spans = Vec::new();
    let mut t = 1000;
    for &(seqs, tokens) in shapes {
        t += 20 + 5 * seqs + 2 * tokens;
        spans.push((t, 300, seqs, Some(tokens)));
        t += 300;
    }
    spans
}

#[test]
fn host_overhead_has_a_per_token_term_where_tokens_differ_from_sequences() {
    // Host time 20 + 5 per sequence + 2 per token, all of it in the gap before each step:
    // decode steps (tokens = sequences) and prompt chunks beside them.
    let shapes = [
        (1, 1),
        (2, 2),
        (1, 100),
        (3, 3),
        (2, 60),
        (4, 4),
        (1, 250),
        (3, 40),
    ];
    let spans = host_20_5_2(&shapes);
    let f = fit_host(&steps_with_tokens(&spans), 1e9).unwrap();
    // The first step has no gap before it.
    assert_eq!(f.gaps, shapes.len() - 1);
    assert!((f.step_us - 20.0).abs() < 1e-6, "{f:?}");
    assert!((f.per_seq_us.unwrap() - 5.0).abs() < 1e-6, "{f:?}");
    assert!((f.per_token_us.unwrap() - 2.0).abs() < 1e-6, "{f:?}");
    assert!(f.rms_us < 1e-6, "{f:?}");
    // Decode steps alone (tokens = sequences): tokens say nothing apart, no per-token term.
    let spans: Vec<_> = spans
        .iter()
        .map(|&(a, b, s, _)| (a, b, s, Some(s)))
        .collect();
    let f = fit_host(&steps_with_tokens(&spans), 1e9).unwrap();
    assert_eq!(f.per_token_us, None);
    assert!(f.per_seq_us.is_some());
    // Every step of one sequence, prompts of different lengths: a per-token term, no
    // per-sequence one.
    let spans: Vec<_> = (0..6u64)
        .map(|i| (1000 + i * 1000, 300, 1, Some(10 + 30 * i)))
        .collect();
    let f = fit_host(&steps_with_tokens(&spans), 1e9).unwrap();
    assert_eq!(f.per_seq_us, None);
    assert!(f.per_token_us.is_some());
}

#[test]
fn host_overhead_of_several_traces_is_fitted_to_all_their_steps() {
    // Two runs of one engine under the same law (20 + 5 per sequence + 2 per token) with
    // different batches, the second also idling once: the pooled fit finds the law over every
    // step, each trace's idle gap told by its own median.
    let a = host_20_5_2(&[(1, 1), (2, 2), (1, 100), (3, 3), (2, 60)]);
    let mut b = host_20_5_2(&[(4, 4), (1, 250), (3, 40), (2, 2), (1, 1), (5, 5)]);
    let last = b.len() - 1;
    b[last].0 += 1_000_000;
    let (pa, pb) = (steps_with_tokens(&a), steps_with_tokens(&b));
    let (fa, fb) = (
        fit_host(&pa, DEFAULT_IDLE_FACTOR).unwrap(),
        fit_host(&pb, DEFAULT_IDLE_FACTOR).unwrap(),
    );
    let f = fit_host_pooled(&[pa.clone(), pb.clone()], DEFAULT_IDLE_FACTOR).unwrap();
    assert_eq!(f.steps, fa.steps + fb.steps);
    assert_eq!(f.gaps, fa.gaps + fb.gaps);
    assert_eq!((f.idle_gaps, fb.idle_gaps), (1, 1));
    assert!((f.step_us - 20.0).abs() < 1e-6, "{f:?}");
    assert!((f.per_seq_us.unwrap() - 5.0).abs() < 1e-6, "{f:?}");
    assert!((f.per_token_us.unwrap() - 2.0).abs() < 1e-6, "{f:?}");
    // One machine slower in the second run (host time doubled): the pooled law lies between
    // the two runs' own.
    let slow: Vec<_> = a
        .iter()
        .scan(0u64, |shift, &(t, d, s, k)| {
            *shift += 20 + 5 * s + 2 * k.unwrap_or(0);
            Some((t + *shift, d, s, k))
        })
        .collect();
    let ps = steps_with_tokens(&slow);
    let fs = fit_host(&ps, DEFAULT_IDLE_FACTOR).unwrap();
    let f = fit_host_pooled(&[pa.clone(), ps], DEFAULT_IDLE_FACTOR).unwrap();
    assert!(
        fa.per_seq_us < f.per_seq_us && f.per_seq_us < fs.per_seq_us,
        "{f:?}"
    );
    // Fewer than two traces that mark steps: nothing pooled.
    assert!(fit_host_pooled(&[pa], DEFAULT_IDLE_FACTOR).is_none());
}

#[test]
fn host_overhead_comes_from_the_gaps_between_device_steps() {
    // Gaps of 30, 50, 40, 20 µs before steps of 2, 4, 3, 1 sequences (10 + 10 per sequence),
    // then a 100 ms idle gap.
    let p = steps(&[
        (1000, 500, 2),
        (1530, 480, 2),
        (2060, 560, 4),
        (2660, 500, 3),
        (3180, 300, 1),
        (103_480, 400, 2),
    ]);
    let f = fit_host(&p, DEFAULT_IDLE_FACTOR).unwrap();
    assert_eq!(f.source, StepSource::DeviceMarkers);
    assert_eq!((f.steps, f.gaps, f.idle_gaps), (6, 4, 1));
    assert!((f.step_us - 10.0).abs() < 1e-9, "{f:?}");
    assert!((f.per_seq_us.unwrap() - 10.0).abs() < 1e-9, "{f:?}");
    assert_eq!(f.per_token_us, None);
    assert!(f.rms_us < 1e-9);
    // The CPU engine's real trace: 13 gaps, none idle. Its ops run one after another, so the
    // time of a step no op covers is its span less the sum of its ops; the slice keeps the ops
    // of steps 0 and 10 only, and a step without ops says nothing about its inside.
    let p = read_path(fixture("cpu_engine_profile.json")).unwrap();
    let f = fit_host(&p, DEFAULT_IDLE_FACTOR).unwrap();
    assert_eq!((f.steps, f.gaps, f.idle_gaps), (14, 13, 0));
    let inner: Vec<f64> = p.steps[1..]
        .iter()
        .map(|s| {
            let ops: u64 = p
                .kernels
                .iter()
                .filter(|k| {
                    k.start_ns
                        .is_some_and(|t| t >= s.start_ns && t < s.end_ns())
                })
                .map(|k| k.dur_ns)
                .sum();
            if ops == 0 {
                0.0
            } else {
                (s.dur_ns - ops) as f64 / 1e3
            }
        })
        .collect();
    assert_eq!(inner.iter().filter(|x| **x > 0.0).count(), 1, "{inner:?}");
    // The slice keeps one step's inside: the gaps are fitted alone and that inside is added.
    let kept_inside: f64 = inner.iter().sum();
    assert!(kept_inside > 0.0);
    assert!((f.in_step_us - kept_inside).abs() < 1e-6, "{f:?} {inner:?}");
    // The gap fit's residuals have mean 0 (a free offset). A prompt step's tokens differ from
    // its sequences: the per-token term is fitted too.
    let gap_fit = f.step_us - f.in_step_us;
    let fitted: f64 = p.steps[1..]
        .iter()
        .map(|s| {
            gap_fit
                + f.per_seq_us.unwrap() * s.seqs.unwrap() as f64
                + f.per_token_us.unwrap() * s.tokens.unwrap() as f64
        })
        .sum();
    assert!((fitted - 8_152.418).abs() < 1e-6 * 8_152.418, "{f:?}");
    // Kernel step ids stand in for markers (Ascend tables); one device, two steps: one gap.
    let p = read_path(fixture("kernel_details_block_dim.csv")).unwrap();
    let f = fit_host(&p, DEFAULT_IDLE_FACTOR).unwrap();
    assert_eq!((f.source, f.gaps), (StepSource::KernelStepIds, 1));
    // Step 1 ends at 401241 + 402.250 µs, step 2 starts at 402000 µs; inside step 2 no kernel
    // runs from 402012.66 to 402013 and from 402324.5 to 402330 (5.84 µs).
    assert!((f.in_step_us - 5.84).abs() < 1e-6, "{f:?}");
    assert!(
        (f.step_us - (402_000.0 - 401_643.25 + 5.84)).abs() < 1e-6,
        "{f:?}"
    );
    assert_eq!(f.per_seq_us, None);
    // One host-side step marker: nothing to fit.
    let p = read_path(fixture("kineto_h800_train_slice.json")).unwrap();
    assert!(fit_host(&p, DEFAULT_IDLE_FACTOR).is_none());
}

#[test]
fn host_time_counts_what_no_kernel_covers_inside_a_step() {
    // Two steps on device 0 with a 20 µs gap; the second (100 µs) has kernels 10-40 and
    // 30-60 (overlapping streams: 50 µs busy) and 70-80: 60 µs busy, 40 µs inside no kernel.
    let mut p = steps(&[(1000, 100, 1), (1120, 100, 1)]);
    for (s, d) in [(1130, 30), (1150, 30), (1190, 10)] {
        let mut k = KernelRecord::new("k".into(), Some(s * 1000), d * 1000, 1);
        k.device = Some(0);
        p.kernels.push(k);
    }
    // A kernel of another device does not count for device 0.
    let mut other = KernelRecord::new("k".into(), Some(1_120_000), 100_000, 1);
    other.device = Some(1);
    p.kernels.push(other);
    let f = fit_host(&p, DEFAULT_IDLE_FACTOR).unwrap();
    assert_eq!(f.gaps, 1);
    assert!((f.in_step_us - 40.0).abs() < 1e-9, "{f:?}");
    assert!((f.step_us - 60.0).abs() < 1e-9, "{f:?}");
    // A device whose kernels the trace does not time says nothing about its steps' insides.
    p.kernels.retain(|k| k.device == Some(1));
    let f = fit_host(&p, DEFAULT_IDLE_FACTOR).unwrap();
    assert_eq!((f.in_step_us, f.step_us), (0.0, 20.0));
}

#[test]
fn every_kernel_of_the_h800_slice_is_accounted_for() {
    let p = read_path(fixture("kineto_h800_train_slice.json")).unwrap();
    assert_eq!(detect_backend(&p), Backend::Cuda);
    let t = map_kernels(&p, Backend::Cuda, &Backend::Cuda.builtin_rules());
    let s = summarize(p.kernels.iter().zip(&t));
    assert_eq!(s.kernels, 93);
    let sum: f64 = [&s.by_class, &s.outside, &s.unmapped]
        .iter()
        .flat_map(|v| v.iter().map(|r| r.share))
        .sum();
    assert!((sum - 1.0).abs() < 1e-9, "{sum}");
    assert!((s.mapped_share + s.outside_share + s.unmapped_share - 1.0).abs() < 1e-9);
    // DeepEP (the layout, the notify and two dispatch kernels), the grouped GEMMs and
    // FlashAttention are recognized.
    let op = |name: &str| s.by_op.iter().find(|r| r.name == name).map(|r| r.kernels);
    assert_eq!(op("dispatch"), Some(4), "{:?}", s.by_op);
    assert_eq!(op("attn_prefill"), Some(1));
    assert_eq!(op("experts"), Some(2));
    assert!(s
        .outside
        .iter()
        .any(|r| r.name == "backward pass (training)"));
    assert!(s.unmapped_share < 0.05, "{:?}", s.unmapped);
}

#[test]
fn ascend_and_cpu_engine_kernels_map_onto_ops_and_classes() {
    let p = read_path(fixture("kernel_details_block_num.csv")).unwrap();
    assert_eq!(detect_backend(&p), Backend::Ascend);
    let t = map_kernels(&p, Backend::Ascend, &Backend::Ascend.builtin_rules());
    let ops: Vec<String> = t
        .iter()
        .map(|t| match t {
            Target::Op { op, .. } => (*op).to_owned(),
            Target::Kind(k) => k.label(),
            Target::Outside { reason, .. } => format!("outside: {reason}"),
            Target::Unmapped => "unmapped".into(),
        })
        .collect();
    assert_eq!(
        ops,
        [
            "dispatch",
            "experts",
            "combine",
            "gemm",
            "gemm",
            "outside: memory set",
            "unmapped"
        ]
    );
    // The CPU engine: its ops map as themselves, its EPLB weight move is outside the op graph,
    // nothing is unmapped.
    let p = read_path(fixture("cpu_engine_profile.json")).unwrap();
    assert_eq!(detect_backend(&p), Backend::Cpu);
    let t = map_kernels(&p, Backend::Cpu, &Backend::Cpu.builtin_rules());
    let s = summarize(p.kernels.iter().zip(&t));
    for k in p.kernels.iter().zip(&t) {
        match k {
            (k, Target::Op { op, kind }) => {
                assert_eq!(*op, &*k.name);
                assert_eq!(
                    Some(*kind),
                    k.op_class.as_deref().and_then(OpKindName::parse)
                );
            }
            (k, other) => assert_eq!((&*k.name, other.kind()), ("eplb_move", None)),
        }
    }
    assert!(s.unmapped.is_empty());
    assert_eq!(s.outside.len(), 1);
}

#[test]
fn a_users_rules_come_first() {
    let p = read_path(fixture("kernel_details_block_num.csv")).unwrap();
    let mine = RuleSet::parse(
        "mine.toml",
        "backend = \"ascend\"\nsource = \"test\"\n[[rule]]\ntype = \"NewOp\"\nop = \"o_proj\"\n[[rule]]\ntype = \"GroupedMatmul\"\nclass = \"gemm\"\n",
    )
    .unwrap();
    let t = map_kernels(
        &p,
        Backend::Ascend,
        &mine.then(Backend::Ascend.builtin_rules()),
    );
    assert!(matches!(t[6], Target::Op { op: "o_proj", .. }));
    assert!(matches!(t[1], Target::Kind(k) if k.label() == "gemm"));
}

#[test]
fn calibrate_fits_what_the_cpu_engine_profile_carries() {
    let p = read_path(fixture("cpu_engine_profile.json")).unwrap();
    let cm = stand_in();
    let opts = |dtype| opts_on(&cm, dtype);
    // The 146 GEMMs carry tokens, k and n; their bytes need the format the engine ran in.
    let cal = calibrate(std::slice::from_ref(&p), &opts(Some(DType::Fp32)));
    let gemm = cal
        .efficiency
        .iter()
        .find(|r| r.class == OpClass::Gemm)
        .unwrap();
    assert_eq!((gemm.kernels, gemm.with_work), (146, 146));
    assert!(gemm.fit.is_some());
    // Per op, the GEMMs' measured time against the class's fit: every sample counted once,
    // under the op it came from, with the fit's own prediction of it.
    let ops = &cal.op_residuals;
    assert!(ops.iter().all(|r| r.class == OpClass::Gemm), "{ops:?}");
    assert_eq!(ops.iter().map(|r| r.kernels).sum::<usize>(), 146);
    let names: Vec<&str> = ops.iter().map(|r| r.op.as_str()).collect();
    for op in ["q_a_proj", "q_b_proj", "kv_a_proj", "o_proj"] {
        assert!(names.contains(&op), "{op}: {names:?}");
    }
    assert!(ops.windows(2).all(|w| w[0].measured_ms >= w[1].measured_ms));
    let measured: f64 = p
        .kernels
        .iter()
        .filter(|k| &*k.name == "q_a_proj")
        .map(|k| k.dur_ns as f64 / 1e6)
        .sum();
    let q_a = ops.iter().find(|r| r.op == "q_a_proj").unwrap();
    assert!((q_a.measured_ms - measured).abs() < 1e-9, "{q_a:?}");
    let fit = gemm.fit.as_ref().unwrap();
    let fitted: f64 = p
        .kernels
        .iter()
        .filter(|k| &*k.name == "q_a_proj")
        .map(|k| {
            let w = kernel_work(k, true, Some(DType::Fp32)).unwrap();
            let x = Sample {
                flops: w.flops,
                bytes: w.bytes,
                rows: w.rows,
                peak_flops: cm.peak_flops(DType::Fp32),
                hbm_bytes_per_s: cm.system.chip.hbm_bytes_per_s(),
                time_us: 0.0,
            };
            gemm.time_us(&x).unwrap() / 1e3
        })
        .sum();
    assert!(
        (q_a.fitted_ms - fitted).abs() < 1e-9 * fitted,
        "{q_a:?} {fit:?}"
    );
    assert!(q_a.error().is_finite());
    let cal = calibrate(std::slice::from_ref(&p), &opts(None));
    let gemm = cal
        .efficiency
        .iter()
        .find(|r| r.class == OpClass::Gemm)
        .unwrap();
    assert_eq!((gemm.with_work, gemm.fit.is_none()), (0, true));
    // Attention, grouped GEMMs and glue carry no shapes a fit can price.
    assert!(cal
        .efficiency
        .iter()
        .filter(|r| r.class != OpClass::Gemm)
        .all(|r| r.with_work == 0));
    // Dispatch and combine carry no bytes: no alpha-beta.
    assert!(cal.alpha_beta.is_empty());
    assert!(cal.host[0].fit.is_some());
}

/// A stand-in system for the CPU engine's fixture: the fits need a peak and a bandwidth; which
/// does not matter here.
fn stand_in() -> CostModel {
    let cat = Catalog::builtin();
    cat.cost_model(cat.system("nvidia-h800-8").unwrap(), None)
        .unwrap()
}

/// The CPU engine's trace in f32, fitted to the total time, on `cm`.
fn cpu_total_on(cm: &CostModel) -> TraceOptions {
    TraceOptions {
        backend: Some(Backend::Cpu),
        objective: Objective::Total,
        ..opts_on(cm, Some(DType::Fp32))
    }
}

/// Options for a trace calibrated or checked on `cm`, the engine's format given.
fn opts_on(cm: &CostModel, dtype: Option<DType>) -> TraceOptions {
    TraceOptions {
        backend: None,
        rules: RuleSet::default(),
        cost: Some(cm.clone()),
        idle_factor: DEFAULT_IDLE_FACTOR,
        dtype,
        model: None,
        objective: Default::default(),
    }
}

#[test]
fn check_prices_each_kernel_with_the_cost_model_as_it_is() {
    let p = read_path(fixture("cpu_engine_profile.json")).unwrap();
    let cm = stand_in();
    let opts = opts_on(&cm, Some(DType::Fp32));
    let ck = check(std::slice::from_ref(&p), &opts).unwrap();
    assert_eq!(ck.hardware, cm.system.name);
    // Every GEMM with its shapes, under its op: measured as traced, priced by the model's
    // compute_op of its work.
    assert_eq!(ck.ops.iter().map(|r| r.kernels).sum::<usize>(), 146);
    for r in &ck.ops {
        let (mut measured, mut priced) = (0.0, 0.0);
        for k in p.kernels.iter().filter(|k| *k.name == r.op) {
            let w = kernel_work(k, true, Some(DType::Fp32)).unwrap();
            let work = Work {
                class: OpClass::Gemm,
                flops: w.flops,
                bytes: w.bytes,
                dtype: DType::Fp32,
                rows: w.rows.unwrap_or(0.0),
                slice: 0.0,
            };
            measured += k.dur_ns as f64 / 1e6;
            priced += cm.compute_op(&r.op, &work).time_s * 1e3;
        }
        assert!((r.measured_ms - measured).abs() < 1e-9, "{r:?}");
        assert!((r.priced_ms - priced).abs() < 1e-9 * priced, "{r:?}");
        assert!(r.rms_error.is_finite() && r.rms_error > 0.0, "{r:?}");
    }
    // The class row is its ops summed.
    let gemm = ck
        .classes
        .iter()
        .find(|r| r.class == OpClass::Gemm)
        .unwrap();
    let sum: f64 = ck.ops.iter().map(|r| r.priced_ms).sum();
    assert!((gemm.priced_ms - sum).abs() < 1e-9 * sum);
    // The shipped H800 cost file's [host] gives eager launches alone: nothing to check a
    // step's host time against.
    assert_eq!(ck.host_terms, None);
    assert!(ck.host[0].check.is_none());
    // Without a cost model there is nothing to price with.
    assert!(check(
        std::slice::from_ref(&p),
        &TraceOptions { cost: None, ..opts }
    )
    .is_none());
}

#[test]
fn a_cost_file_written_by_calibrate_prices_its_own_trace_as_the_fit_did() {
    // Fitted on the fixture, written as a cost file, read back: checking the same trace with it
    // gives the fit's own prediction of every op (what the twin prices is what was fitted).
    let p = read_path(fixture("cpu_engine_profile.json")).unwrap();
    let base = stand_in();
    let opts = |cost: CostModel| opts_on(&cost, Some(DType::Fp32));
    let cal = calibrate(std::slice::from_ref(&p), &opts(base.clone()));
    let text = cost_file(&base.params, "fitted", &cal).unwrap();
    let params: CostParams = toml::from_str(&text).unwrap();
    let fitted = CostModel::new(base.system.clone(), params);
    let ck = check(std::slice::from_ref(&p), &opts(fitted)).unwrap();
    assert_eq!(ck.ops.len(), cal.op_residuals.len());
    for r in &cal.op_residuals {
        let c = ck.ops.iter().find(|c| c.op == r.op).unwrap();
        assert_eq!(c.kernels, r.kernels);
        assert!(
            (c.priced_ms - r.fitted_ms).abs() < 1e-3 * r.fitted_ms,
            "{c:?} against {r:?}"
        );
    }
    // The host terms written price the host time the fit saw: the rms is the fit's.
    let h = cal.host[0].fit.as_ref().unwrap();
    let hc = ck.host[0].check.as_ref().unwrap();
    assert_eq!(hc.gaps, h.gaps);
    assert!(
        (hc.rms_us - h.rms_us).abs() < 1e-3 * h.rms_us.max(1.0),
        "{hc:?} {h:?}"
    );
}

#[test]
fn the_host_check_prices_each_step_with_the_terms_given() {
    // Host time 20 + 5 per sequence + 2 per token before each step.
    let shapes = [(1, 1), (2, 2), (1, 100), (3, 3), (2, 60), (4, 4)];
    let spans = host_20_5_2(&shapes);
    let p = steps_with_tokens(&spans);
    let exact = check_host(&p, 1e9, 20.0, 5.0, 2.0).unwrap();
    assert_eq!(exact.gaps, shapes.len() - 1);
    assert!(exact.rms_us < 1e-9, "{exact:?}");
    assert!((exact.priced_ms - exact.measured_ms).abs() < 1e-12);
    // One more microsecond per sequence: priced higher by the sequences of the steps checked.
    let more = check_host(&p, 1e9, 20.0, 6.0, 2.0).unwrap();
    let seqs: u64 = shapes[1..].iter().map(|s| s.0).sum();
    assert!((more.priced_ms - exact.priced_ms - seqs as f64 / 1e3).abs() < 1e-12);
    assert_eq!(more.measured_ms, exact.measured_ms);
    assert!(check_host(&steps(&[(0, 10, 1)]), 1e9, 1.0, 0.0, 0.0).is_none());
}

/// A CPU-engine-like profile of `steps` steps of four GEMMs each, timed by `TRUTH` on `cm`, 40
/// µs apart; every `every`th step comes after 20 ms of idling and runs its kernels `cold` times
/// slower.
fn idling_profile(cm: &CostModel, steps: u64, every: u64, cold: f64) -> Profile {
    idling_profile_apart(cm, steps, every, cold, 40.0)
}

/// [`idling_profile`] with the busy steps `gap_us` apart.
fn idling_profile_apart(cm: &CostModel, steps: u64, every: u64, cold: f64, gap_us: f64) -> Profile {
    noisy_profile(cm, steps, every, cold, gap_us, |_| 1.0)
}

/// [`idling_profile_apart`] with step `i`'s kernels at `noise(i)` times their time (on top of
/// the cold factor).
fn noisy_profile(
    cm: &CostModel,
    steps: u64,
    every: u64,
    cold: f64,
    gap_us: f64,
    mut noise: impl FnMut(u64) -> f64,
) -> Profile {
    let gemm = |m: f64, k: f64, n: f64| {
        TRUTH.time_us(&Sample {
            flops: 2.0 * m * k * n,
            bytes: 4.0 * (m * k + k * n + m * n),
            rows: Some(m),
            peak_flops: cm.peak_flops(DType::Fp32),
            hbm_bytes_per_s: cm.system.chip.hbm_bytes_per_s(),
            time_us: 0.0,
        })
    };
    let ops = [
        ("q_a_proj", 7168u64, 1536u64),
        ("kv_a_proj", 7168, 576),
        ("o_proj", 2048, 7168),
        ("ffn_down", 2048, 7168),
    ];
    let mut p = steps_with_tokens(&[]);
    p.origin = "idling".into();
    let mut t = 1000.0; // µs
    for i in 0..steps {
        let is_cold = i % every == every - 1;
        t += if is_cold { 20_000.0 } else { gap_us };
        let tokens = 2 + (i * 37) % 190;
        let start = t;
        let factor = noise(i) * if is_cold { cold } else { 1.0 };
        for (op, k, n) in ops {
            let dur = gemm(tokens as f64, k as f64, n as f64) * factor;
            let mut r = KernelRecord::new(op.into(), Some((t * 1e3) as u64), (dur * 1e3) as u64, 1);
            r.device = Some(0);
            r.op_class = Some("gemm".into());
            r.layer = Some(0);
            r.shapes = Some(format!(r#"{{"tokens":{tokens},"k":{k},"n":{n}}}"#));
            p.kernels.push(r);
            t += dur + 1.0;
        }
        t += 5.0;
        p.steps.push(StepMarker {
            step: i,
            device: Some(0),
            start_ns: (start * 1e3) as u64,
            dur_ns: ((t - start) * 1e3) as u64,
            on_device: true,
            seqs: Some(1),
            tokens: Some(tokens),
            line: 1,
        });
    }
    p
}

#[test]
fn steps_after_idling_are_fitted_apart_and_give_their_factor() {
    let cm = stand_in();
    let opts = cpu_total_on(&cm);
    // 60 steps, 10 of them after idling at 1.25 times their warm kernel time.
    let p = idling_profile(&cm, 60, 6, 1.25);
    let cal = calibrate(std::slice::from_ref(&p), &opts);
    let cold = cal.cold.as_ref().expect("ten steps after idling");
    assert_eq!((cold.steps, cold.kernels), (10, 40));
    assert!(close(cold.factor, 1.25, 2e-3), "{cold:?}");
    // The idle gaps are 20 ms, the others 40 µs (plus the kernels' 1 µs seams): the threshold
    // is five times the median gap.
    assert!(cold.after_us > 40.0 && cold.after_us < 20_000.0, "{cold:?}");
    // The warm kernels alone set the form: the truth, not a blend with the cold ones.
    let gemm = cal
        .efficiency
        .iter()
        .find(|r| r.class == OpClass::Gemm)
        .unwrap();
    let f = gemm.fit.as_ref().unwrap();
    assert_eq!(gemm.with_work, 200);
    // (These GEMMs are memory-bound on the stand-in system.)
    assert!(close(f.params.memory, TRUTH.memory, 2e-3), "{f:?}");
    assert!(f.rms_error < 2e-3, "{f:?}");
    // The cost file carries both, and the check of the same trace with it prices the cold steps
    // at the factor.
    let text = cost_file(&cm.params, "idle", &cal).unwrap();
    let params: CostParams = toml::from_str(&text).unwrap();
    params.validate("idle").unwrap();
    let h = params.host.as_ref().unwrap();
    assert!(close(h.cold_factor.unwrap(), 1.25, 2e-3), "{h:?}");
    assert!(
        close(h.cold_after_us.unwrap(), cold.after_us, 1e-3),
        "{h:?}"
    );
    let fitted = CostModel::new(cm.system.clone(), params);
    let ck = check(
        std::slice::from_ref(&p),
        &TraceOptions {
            cost: Some(fitted),
            ..opts.clone()
        },
    )
    .unwrap();
    let c = ck.cold.as_ref().unwrap();
    assert_eq!((c.steps, c.kernels), (10, 40));
    assert!(close(c.warm_ms * c.factor, c.measured_ms, 3e-3), "{c:?}");
    let gemm = ck
        .classes
        .iter()
        .find(|r| r.class == OpClass::Gemm)
        .unwrap();
    assert!(close(gemm.priced_ms, gemm.measured_ms, 3e-3), "{gemm:?}");
    // Without a slowdown the factor is one; with too few steps after idling none is fitted.
    let even = calibrate(&[idling_profile(&cm, 60, 6, 1.0)], &opts);
    assert!(close(even.cold.as_ref().unwrap().factor, 1.0, 2e-3));
    // Steps overlapping (the host ran ahead: a median gap of 0): the host fit leaves no gap out
    // as idle, so no step follows idling either.
    let overlapped = calibrate(&[idling_profile_apart(&cm, 60, 6, 1.25, -1.0)], &opts);
    assert_eq!(overlapped.host[0].fit.as_ref().unwrap().idle_gaps, 0);
    assert!(overlapped.cold.is_none());
    let few = calibrate(&[idling_profile(&cm, 12, 6, 1.25)], &opts);
    assert!(few.cold.is_none());
    assert_eq!(
        few.efficiency
            .iter()
            .find(|r| r.class == OpClass::Gemm)
            .unwrap()
            .with_work,
        48
    );
}

#[test]
fn the_spread_of_warm_steps_around_their_price_gives_step_sigma() {
    let cm = stand_in();
    let opts = cpu_total_on(&cm);
    // 400 steps, every tenth after idling at 1.25; each step's kernels at a lognormal factor of
    // spread 0.2 (seeded: the test is deterministic).
    let noisy = |sigma: f64| {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        noisy_profile(&cm, 400, 10, 1.25, 40.0, move |_| {
            // Box-Muller: one standard normal from two uniforms.
            let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
            (sigma * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()).exp()
        })
    };
    let p = noisy(0.2);
    let cal = calibrate(std::slice::from_ref(&p), &opts);
    let sp = cal.spread.as_ref().expect("360 warm steps");
    // The warm steps only, in groups of alike steps (here one: every step has a prompt, and
    // its memory-bound GEMMs cost about the same whatever its tokens).
    assert!(sp.steps > 300 && sp.steps <= 360, "{sp:?}");
    assert_eq!(sp.bias.len(), 1, "{sp:?}");
    assert!(sp.bias.iter().all(|b| b.decode_only == Some(false)));
    // Deciles of a sample of 360: the spread within 15%.
    assert!(close(sp.sigma, 0.2, 0.15), "{sp:?}");
    // The cold factor is still told apart (the noise averages over 40 cold steps).
    assert!(
        close(cal.cold.as_ref().unwrap().factor, 1.25, 0.1),
        "{:?}",
        cal.cold
    );
    // The cost file carries it, and a check of the same trace with that file finds the same
    // spread, the file's beside it.
    let text = cost_file(&cm.params, "noisy", &cal).unwrap();
    let params: CostParams = toml::from_str(&text).unwrap();
    params.validate("noisy").unwrap();
    let h = params.host.as_ref().unwrap();
    assert!(close(h.step_sigma, sp.sigma, 1e-3), "{h:?}");
    assert!(text.contains("step_sigma: over the kernels of"), "{text}");
    let ck = check(
        std::slice::from_ref(&p),
        &TraceOptions {
            cost: Some(CostModel::new(cm.system.clone(), params)),
            ..opts.clone()
        },
    )
    .unwrap();
    assert!(close(ck.file_step_sigma, sp.sigma, 1e-3));
    let cs = ck.spread.as_ref().unwrap();
    assert!(close(cs.sigma, 0.2, 0.2), "{cs:?}");
    // Without noise, steps land on their price: no spread.
    let quiet = calibrate(&[noisy(0.0)], &opts);
    assert!(
        quiet.spread.as_ref().unwrap().sigma < 1e-3,
        "{:?}",
        quiet.spread
    );
    // Too few steps tell nothing.
    let few = calibrate(&[idling_profile(&cm, 12, 6, 1.25)], &opts);
    assert!(few.spread.is_none());
}
