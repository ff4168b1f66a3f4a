//! Profiler trace readers: every format into the same normalized records, with the values the
//! files hold (computed by hand from the fixtures), and errors that name the line.
//!
//! `kineto_h800_train_slice.json` is a slice of a real trace (tests/data/README.md). The Ascend
//! samples (`kernel_details_block_dim.csv`, `kernel_details_block_num.csv`,
//! `op_summary_msprof.csv`, `op_statistic.csv`, `communication.json`, `trace_view.json`) are
//! written by hand from the formats' documentation (the CANN profiling guide's field tables,
//! torch_npu's csv headers and output layout): no real file of them is at hand.
//! `cpu_engine_profile.json` is a slice of a real trace of the CPU engine.

use crate::fixture;
use dstwin_traces::profile::{ascend, chrome, communication, read_path, ProfileFormat};
use dstwin_traces::TraceError;

/// MB-to-byte conversions of decimal sizes are exact to a few ulps, not bit for bit.
fn assert_close(got: Option<f64>, want: f64) {
    let got = got.expect("a value");
    assert!((got / want - 1.0).abs() < 1e-12, "{got} vs {want}");
}

#[test]
fn a_kineto_gpu_trace_reads_as_kernels_and_a_host_step() {
    let p = chrome::from_path(fixture("kineto_h800_train_slice.json")).unwrap();
    assert_eq!(p.format, ProfileFormat::ChromeJson);
    // 89 `kernel`, 2 `gpu_memcpy`, 2 `gpu_memset` events; 18,443 µs in all.
    assert_eq!(p.kernels.len(), 93);
    assert_eq!(p.kernel_time_ns(), 18_443_000);
    let first = &p.kernels[0];
    assert!(
        first.name.starts_with("void layer_norm::ln_fwd_kernel"),
        "{}",
        first.name
    );
    assert_eq!(first.start_ns, Some(1_740_461_679_471_821_000));
    assert_eq!((first.device, first.stream), (Some(0), Some(7)));
    assert_eq!(first.op_type.as_deref(), Some("kernel"));
    // Kernels come out in start order.
    assert!(p.kernels.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
    // The one step annotation is the host's (`user_annotation`), not the device's.
    assert_eq!(p.steps.len(), 1);
    let s = &p.steps[0];
    assert_eq!((s.step, s.on_device), (1, false));
    assert_eq!(
        (s.start_ns, s.dur_ns),
        (1_740_461_679_470_813_000, 112_202_000)
    );
    assert_eq!(p.notes["devices"], "2 x NVIDIA H800");
    assert_eq!(p.notes["distributed.world_size"], "64");
    // Host events are counted, not kept: 8 cpu_op, 8 cuda_runtime, 7 other annotations.
    assert_eq!(p.skipped["cpu_op"], 8);
    assert_eq!(p.skipped["cuda_runtime"], 8);
    assert_eq!(p.skipped["user_annotation"], 7);
    assert_eq!(p.skipped["metadata"], 12);
    assert_eq!(p.skipped["ac2g"], 4);
}

#[test]
fn nccl_kernels_carry_their_bytes_and_launching_ops_their_shapes() {
    let text = r#"{"traceEvents": [
      {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
       "args": {"External id": 7, "Input Dims": [[128, 7168], [7168, 2048]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}},
      {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x256", "pid": 0, "tid": 7, "ts": 12, "dur": 30.5,
       "args": {"External id": 7, "device": 0, "stream": 7}},
      {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "tid": 20, "ts": 50, "dur": 40,
       "args": {"device": 0, "stream": 20, "Collective name": "allreduce", "In msg nelems": 1048576, "Out msg nelems": 1048576,
                "Group size": 8, "dtype": "BFloat16", "Process Group Name": "0"}},
      {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": 0, "tid": 7, "ts": 11, "dur": 90}
    ]}"#;
    let p = chrome::from_reader(text.as_bytes(), "t.json").unwrap();
    assert_eq!(p.kernels.len(), 2);
    let gemm = &p.kernels[0];
    assert_eq!(gemm.shapes.as_deref(), Some("[[128,7168],[7168,2048]]"));
    assert_eq!(
        gemm.dtypes.as_deref(),
        Some("[\"c10::BFloat16\",\"c10::BFloat16\"]")
    );
    assert_eq!(gemm.dur_ns, 30_500);
    let c = p.kernels[1].comm.as_ref().unwrap();
    assert_eq!(c.collective.as_deref(), Some("allreduce"));
    assert_eq!(c.group_size, Some(8));
    assert_eq!(c.bytes, Some(2.0 * 1_048_576.0));
    // A device-side step annotation.
    assert_eq!(p.steps.len(), 1);
    assert!(p.steps[0].on_device);
    assert_eq!(p.steps[0].step, 3);
}

#[test]
fn torch_npu_trace_view_keeps_npu_tasks_and_collectives_named_later() {
    let p = chrome::from_path(fixture("trace_view.json")).unwrap();
    // Three tasks of "Ascend Hardware" and the hcom op of "HCCL"; the HCCL task (Notify_Wait)
    // and "Overlap Analysis" are not kernels. Process names come after the events.
    let names: Vec<&str> = p.kernels.iter().map(|k| &*k.name).collect();
    assert_eq!(
        names,
        [
            "MatMulV2",
            "GroupedMatmul",
            "hcom_allReduce__844_2_1",
            "MatMulV2"
        ]
    );
    assert_eq!(p.kernels[1].dur_ns, 820_125);
    // String timestamps keep their nanoseconds.
    assert_eq!(p.kernels[0].start_ns, Some(1_713_174_287_400_013_000));
    assert_eq!(p.kernels[0].stream, Some(2));
    assert!(p.kernels[2].comm.is_some());
    assert_eq!(p.skipped["HCCL"], 1);
    assert_eq!(p.skipped["Overlap Analysis"], 1);
    // Host-side step annotations.
    let steps: Vec<(u64, bool)> = p.steps.iter().map(|s| (s.step, s.on_device)).collect();
    assert_eq!(steps, [(1, false), (2, false)]);
    assert_eq!(p.steps[0].start_ns, 1_713_174_287_399_990_000);
}

#[test]
fn both_kernel_details_header_generations_and_msprof_op_summary_read_alike() {
    let old = ascend::kernel_details_from_path(fixture("kernel_details_block_dim.csv")).unwrap();
    assert_eq!(old.notes["header"], "KernelDetailsBlockDim");
    assert_eq!(old.kernels.len(), 8);
    // 12.340 + 310.500 + 820.125 + 95 + 402.250 + 12.660 + 311.500 + 97.500 µs.
    assert_eq!(old.kernel_time_ns(), 2_061_875);
    let mm = &old.kernels[1];
    assert_eq!(&*mm.name, "aclnnMm_MatMulCommon_MatMulV2");
    assert_eq!(mm.op_type.as_deref(), Some("MatMulV2"));
    assert_eq!(mm.start_ns, Some(1_713_174_287_400_013_000));
    assert_eq!((mm.step, mm.stream, mm.device), (Some(1), Some(2), None));
    assert_eq!(mm.shapes.as_deref(), Some("4096,7168;7168,1536"));
    assert_eq!(mm.dtypes.as_deref(), Some("DT_BF16;DT_BF16"));
    let hcom = &old.kernels[3];
    assert!(hcom.name.starts_with("hcom_allReduce_") && hcom.comm.is_some());
    assert_eq!(hcom.stream, None, "N/A is no stream");

    let new = ascend::kernel_details_from_path(fixture("kernel_details_block_num.csv")).unwrap();
    assert_eq!(new.notes["header"], "KernelDetailsBlockNum");
    assert_eq!(new.kernels.len(), 7);
    let d = &new.kernels[0];
    assert_eq!(d.op_type.as_deref(), Some("MoeDistributeDispatchV2"));
    assert_eq!((d.step, d.device, d.stream), (Some(5), Some(3), Some(4)));
    assert_eq!(d.start_ns, Some(1_754_000_000_100_000_125));
    assert_eq!(d.dur_ns, 85_375);

    let summary = ascend::kernel_details_from_path(fixture("op_summary_msprof.csv")).unwrap();
    assert_eq!(summary.notes["header"], "OpSummary");
    assert_eq!(summary.kernels.len(), 2);
    // Values end in a tab, as msprof writes them.
    assert_eq!(summary.kernels[0].start_ns, Some(1_713_174_287_500_000_500));
    assert_eq!(summary.kernels[0].dur_ns, 40_250);
    assert_eq!(summary.kernels[0].device, Some(0));
}

#[test]
fn op_statistic_rows_are_aggregated_records() {
    let p = ascend::op_statistic_from_path(fixture("op_statistic.csv")).unwrap();
    assert_eq!(p.format, ProfileFormat::OpStatisticCsv);
    let gm = &p.kernels[0];
    assert_eq!(
        (&*gm.name, gm.calls, gm.dur_ns, gm.start_ns),
        ("GroupedMatmul", 122, 100_050_250, None)
    );
    assert_eq!(
        p.kernels.iter().map(|k| k.calls).sum::<u64>(),
        122 + 488 + 61 + 244
    );
    assert!(p.kernels[2].comm.is_some());
}

#[test]
fn communication_json_gives_each_collective_its_bytes_and_group() {
    let p = communication::from_path(fixture("communication.json")).unwrap();
    // Two ops; "Total Op Info" is a sum and left out.
    assert_eq!(p.kernels.len(), 2);
    assert_eq!(p.skipped["Total Op Info"], 1);
    let a = &p.kernels[0];
    assert_eq!(&*a.name, "hcom_allReduce__844_2_1");
    assert_eq!((a.step, a.dur_ns), (Some(1), 95_000));
    let c = a.comm.as_ref().unwrap();
    assert_eq!(c.group.as_deref(), Some("13681369207305868844"));
    // HCCS and SDMA carry the same bytes: counted once.
    assert_close(c.bytes, 3_670_016.0);
    // Step 2 also went over RDMA: RDMA + max(SDMA, HCCS).
    let b = p.kernels[1].comm.as_ref().unwrap();
    assert_close(b.bytes, 7_340_032.0 + 1_048_576.0);
}

#[test]
fn a_torch_npu_directory_is_one_profile_with_joined_communication() {
    let dir = std::env::temp_dir().join(format!("dstwin-npu-{}", std::process::id()));
    let out = dir.join("localhost_123_ascend_pt/ASCEND_PROFILER_OUTPUT");
    std::fs::create_dir_all(&out).unwrap();
    for (from, to) in [
        ("kernel_details_block_dim.csv", "kernel_details.csv"),
        ("trace_view.json", "trace_view.json"),
        ("communication.json", "communication.json"),
        ("op_statistic.csv", "op_statistic.csv"),
    ] {
        std::fs::copy(fixture(from), out.join(to)).unwrap();
    }
    let p = read_path(dir.join("localhost_123_ascend_pt")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(p.format, ProfileFormat::AscendProfilerOutput);
    // Kernels from kernel_details.csv (not also from trace_view.json or op_statistic.csv).
    assert_eq!(p.kernels.len(), 8);
    // Steps from trace_view.json.
    assert_eq!(p.steps.len(), 2);
    // Each hcom row got its step's bytes.
    let bytes: Vec<Option<f64>> = p
        .kernels
        .iter()
        .filter_map(|k| k.comm.as_ref().map(|c| c.bytes))
        .collect();
    assert_eq!(bytes.len(), 2);
    assert_close(bytes[0], 3_670_016.0);
    assert_close(bytes[1], 7_340_032.0 + 1_048_576.0);
}

#[test]
fn the_cpu_engine_profile_gives_ops_with_their_shapes_and_steps() {
    let p = read_path(fixture("cpu_engine_profile.json")).unwrap();
    // 14 step events, the ops of steps 0 and 10 and step 10's EPLB weight move.
    assert_eq!(p.steps.len(), 14);
    assert!(p.steps.iter().all(|s| s.on_device && s.device == Some(0)));
    assert_eq!(
        (p.steps[1].step, p.steps[1].seqs, p.steps[1].tokens),
        (1, Some(4), Some(145))
    );
    assert_eq!(p.kernels.len(), 311);
    // 25,697.691 µs of ops and a 2,001.042 µs move.
    assert_eq!(p.kernel_time_ns(), 27_698_733);
    let q = p.kernels.iter().find(|k| &*k.name == "q_a_proj").unwrap();
    assert_eq!(q.op_class.as_deref(), Some("gemm"));
    assert_eq!((q.layer, q.step, q.stream), (Some(0), Some(0), Some(0)));
    assert_eq!(q.shapes.as_deref(), Some(r#"{"k":256,"n":64,"tokens":48}"#));
    assert_eq!(q.dur_ns, 1_884_203);
    let d = p.kernels.iter().find(|k| &*k.name == "dispatch").unwrap();
    assert_eq!(d.comm.as_ref().unwrap().group_size, Some(4));
    let m = p.kernels.iter().find(|k| &*k.name == "eplb_move").unwrap();
    assert_eq!(
        (m.step, m.bytes, m.op_class.as_deref()),
        (Some(10), Some(3_735_552.0), None)
    );
}

#[test]
fn errors_name_the_file_and_line() {
    // A kernel without a duration, on line 3.
    let text = "{\"traceEvents\": [\n{\"ph\": \"M\", \"name\": \"x\"},\n{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 5}\n]}";
    match chrome::from_reader(text.as_bytes(), "t.json").unwrap_err() {
        TraceError::BadField {
            origin,
            line,
            field,
            ..
        } => {
            assert_eq!(
                (origin.as_str(), line, field.as_str()),
                ("t.json", 3, "dur")
            );
        }
        e => panic!("{e}"),
    }
    // Malformed JSON on line 2.
    let e =
        chrome::from_reader("{\"traceEvents\": [\n{\"ph\": }]}".as_bytes(), "t.json").unwrap_err();
    assert!(matches!(e, TraceError::Syntax { line: 2, .. }), "{e}");
    // A negative duration names its value.
    let text = "[{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 5, \"dur\": -3}]";
    let e = chrome::from_reader(text.as_bytes(), "t.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("t.json:1") && e.contains("dur") && e.contains("-3"),
        "{e}"
    );
    // A CSV duration that is not a number, on line 3 (line 1 is the header).
    let csv = "Name,Type,Start Time(us),Duration(us)\nA,MatMulV2,1,2\nB,MatMulV2,3,x\n";
    let e = ascend::kernel_details_from_reader(csv.as_bytes(), "k.csv").unwrap_err();
    assert!(
        matches!(&e, TraceError::BadField { line: 3, field, .. } if field == "Duration(us)"),
        "{e}"
    );
    // A missing column names both accepted spellings.
    let e = ascend::kernel_details_from_reader("Name,Type\nA,B\n".as_bytes(), "k.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Start Time(us)") && e.contains("Task Start Time(us)"),
        "{e}"
    );
    // communication.json: an elapsed time that is not a number.
    let text = "{\"step1\": {\"collective\": {\n\"hcom_x@1\": {\"Communication Time Info\": {\"Elapse Time(ms)\": \"soon\"}}}}}";
    let e = communication::from_reader(text.as_bytes(), "c.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("c.json:2") && e.contains("Elapse Time(ms)"),
        "{e}"
    );
    // Not a profile at all.
    let e = read_path(fixture("README.md")).unwrap_err().to_string();
    assert!(e.contains("README.md"), "{e}");
}
