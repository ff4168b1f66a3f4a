//! The progress bar every long-running command draws on stderr: hidden when stderr is not a
//! terminal or with `--quiet`, and cleared when dropped, so that a command returning early
//! with an error leaves no stale line above its message.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `len` steps (unknown: `None`) in `template` (indicatif syntax).
pub fn bar(len: Option<u64>, quiet: bool, template: &str) -> ProgressBar {
    let target = if !quiet && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(len, target).with_finish(ProgressFinish::AndClear);
    // The templates are literals in this crate; one that does not parse keeps the default style.
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}
