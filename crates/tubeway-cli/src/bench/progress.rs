//! The progress line on stderr: shown only on a terminal, never with --json.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress line over the planned figures.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A line for `figures` figures; hidden when `hidden` or stderr is not a terminal.
    pub fn new(figures: u64, hidden: bool) -> Progress {
        let target = if hidden || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(figures), target);
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed:>4} [{bar:24}] {pos}/{len} figures  {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// Says what is being measured now.
    pub fn doing(&self, what: impl Into<String>) {
        self.bar.set_message(what.into());
    }

    /// One figure done.
    pub fn done_one(&self) {
        self.bar.inc(1);
    }

    /// Removes the line.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
