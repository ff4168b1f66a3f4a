//! A scenario's deployment on twin devices in the engine's wall-clock runtime: what
//! `dstwin serve --device twin` runs (feature `serve`).

use crate::run::{build_fabric, build_instances, deployment_config, BuiltInstance, RunError};
use crate::scenario::Scenario;
use dstwin_core::device::{Device, Fabric};
use dstwin_runtime::{Runtime, RuntimeConfig, ServeInstance};

/// How to run the twin in wall-clock time.
#[derive(Clone, Debug)]
pub struct TwinServe {
    /// Model name clients must ask for.
    pub model: String,
    /// Wall seconds per predicted second (0: no waiting).
    pub time_scale: f64,
    /// Requests in flight before new ones get 429.
    pub max_pending: usize,
    /// Keep a log of every step (conformance checks).
    pub record_steps: bool,
}

/// Starts the scenario's instances, each on its twin device, on the current tokio runtime. The
/// scenario's workload is not used: clients bring the requests.
pub fn start(s: &Scenario, t: TwinServe) -> Result<Runtime, RunError> {
    let built = build_instances(s)?;
    let fabric = build_fabric(s, &built);
    let instances = built
        .into_iter()
        .map(|b| ServeInstance {
            spec: b.spec(false, true),
            device: Box::new(b.device),
        })
        .collect();
    Ok(Runtime::start(
        RuntimeConfig {
            model: t.model,
            time_scale: t.time_scale,
            max_pending: t.max_pending,
            deployment: deployment_config(s),
            record_steps: t.record_steps,
        },
        instances,
        Box::new(fabric),
    ))
}

/// Starts the scenario's instances (`built`, from [`build_instances`]) on devices the caller
/// built for them (a real engine), one per instance in the same order, with the fabric that
/// joins them. Each device's capacity sets its instance's KV blocks; the scenario sets the
/// rest (layout, scheduler knobs, MTP, proxy policies).
pub fn start_on(
    s: &Scenario,
    t: TwinServe,
    built: Vec<BuiltInstance>,
    devices: Vec<Box<dyn Device + Send>>,
    fabric: Box<dyn Fabric + Send>,
) -> Result<Runtime, RunError> {
    if built.len() != devices.len() {
        return Err(RunError::Devices(format!(
            "the scenario has {} instances, {} devices were built",
            built.len(),
            devices.len()
        )));
    }
    let mut instances = Vec::with_capacity(devices.len());
    for (b, device) in built.into_iter().zip(devices) {
        let cap = device.capacity();
        if cap.dp_ranks != b.config.dp_ranks || cap.block_size != b.config.block_size {
            return Err(RunError::Devices(format!(
                "instance {}: the device has {} DP ranks of {}-token blocks, the scenario {} of {}",
                b.name, cap.dp_ranks, cap.block_size, b.config.dp_ranks, b.config.block_size
            )));
        }
        let mut spec = b.spec(true, true);
        spec.config.num_kv_blocks = cap.kv_blocks_per_rank;
        spec.detail = device.wants_requests();
        if spec.detail {
            // An engine's rebalance cycle runs on its routers' counts, not on the twin's
            // expected shares (recording both would count every step twice).
            if let Some(e) = spec.eplb.as_mut() {
                e.shares = None;
            }
        }
        instances.push(ServeInstance { spec, device });
    }
    Ok(Runtime::start(
        RuntimeConfig {
            model: t.model,
            time_scale: t.time_scale,
            max_pending: t.max_pending,
            deployment: deployment_config(s),
            record_steps: t.record_steps,
        },
        instances,
        fabric,
    ))
}
