//! The progress bar every long-running command draws on stderr: hidden when stderr is not a
//! terminal or with `--quiet`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `len` steps (unknown: `None`) in `template` (indicatif syntax).
pub fn bar(len: Option<u64>, quiet: bool, template: &str) -> ProgressBar {
    let target = if !quiet && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(len, target);
    // The templates are literals in this crate; one that does not parse keeps the default style.
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}
