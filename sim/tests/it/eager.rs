//! Eager steps (`enforce_eager`, or steps no graph was captured for under `FULL_DECODE_ONLY`)
//! launch their kernels one by one: a step takes at least the cost file's launch time.

use crate::default_with;
use dstwin_sim::run::{run, RunOptions};

#[test]
fn an_eager_instance_steps_no_faster_than_its_kernel_launches() {
    // The default scenario (DeepSeek-V3.1, 61 layers, MTP 3) with its decode instance eager:
    // every decode step takes at least 2.7 ms x (61 + 3) on A3.
    let floor_ms = 2.7 * 64.0;
    let s = default_with(&["workload.num_requests=40", "decode.enforce_eager=true"]).unwrap();
    let r = run(&s, RunOptions::default()).unwrap().report;
    let d = r.instances.iter().find(|i| i.name == "decode").unwrap();
    assert!(d.mean_step_ms >= floor_ms - 1e-6, "{} ms", d.mean_step_ms);
    let graphs = default_with(&["workload.num_requests=40"]).unwrap();
    let g = run(&graphs, RunOptions::default()).unwrap().report;
    let gd = g.instances.iter().find(|i| i.name == "decode").unwrap();
    assert!(gd.mean_step_ms < floor_ms, "{} ms", gd.mean_step_ms);
    // Not with a graph mode.
    let bad = default_with(&[
        "decode.enforce_eager=true",
        "decode.cudagraph_mode=\"FULL_DECODE_ONLY\"",
    ]);
    let e = bad.unwrap_err().to_string();
    assert!(e.contains("enforce_eager"), "{e}");
}
