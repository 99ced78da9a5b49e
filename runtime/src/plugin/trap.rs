//! What a trapped plugin call says about itself: wasmtime's reason, and
//! what the plugin wrote to stderr during the call. A Rust panic's source
//! location and a failed allocation are always shown to the client; a
//! panic's message and any other output only with `--plugin-panic-details`,
//! since they can quote the client's input. The log gets all of it, on one
//! line.

/// Rust's hint after a panic, which nobody can act on in a sandbox with no
/// environment.
const BACKTRACE_HINT: &str = "note: run with `RUST_BACKTRACE=1`";

/// A trap described for the client (`shown`) and for the log (`logged`).
pub(super) struct Described {
    pub(super) shown: String,
    pub(super) logged: String,
}

/// Describes a trap with wasmtime's `reason` and the call's `stderr`;
/// `details` (`--plugin-panic-details`) shows the panic's message and the
/// rest of stderr to the client too.
pub(super) fn describe(reason: &str, stderr: &str, details: bool) -> Described {
    let lines: Vec<&str> =
        stderr.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with(BACKTRACE_HINT)).collect();
    let logged =
        if lines.is_empty() { reason.to_owned() } else { format!("{reason}; its stderr: {}", lines.join(" | ")) };
    let mut shown = reason.to_owned();
    let panicked = lines.iter().position(|l| l.contains(" panicked at "));
    if let Some(at) = panicked {
        let location = lines[at].split(" panicked at ").nth(1).unwrap_or_default().trim_end_matches(':');
        shown.push_str(&format!("; it panicked at {location}"));
        let message = lines[at + 1..].join(" | ");
        if details && !message.is_empty() {
            shown.push_str(&format!(": {message}"));
        }
    } else if let Some(allocation) = lines.iter().find(|l| l.starts_with("memory allocation of ")) {
        shown.push_str(&format!("; {allocation}"));
    } else if details && !lines.is_empty() {
        shown.push_str(&format!("; its stderr: {}", lines.join(" | ")));
    }
    if !details && logged.len() > shown.len() + "; its stderr: ".len() {
        shown.push_str(" (what it wrote to stderr is in the server's log)");
    }
    Described { shown, logged }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PANIC: &str = "\nthread '<unnamed>' panicked at src/lib.rs:36:25:\ndeliberate trap with the input 1,2,x\n\
                         note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";

    #[test]
    fn a_panic_shows_its_location_and_its_message_only_when_asked() {
        let quiet = describe("wasm trap: unreachable", PANIC, false);
        assert_eq!(
            quiet.shown,
            "wasm trap: unreachable; it panicked at src/lib.rs:36:25 (what it wrote to stderr is in the server's log)"
        );
        assert_eq!(
            quiet.logged,
            "wasm trap: unreachable; its stderr: thread '<unnamed>' panicked at src/lib.rs:36:25: | deliberate trap \
             with the input 1,2,x"
        );
        let detailed = describe("wasm trap: unreachable", PANIC, true);
        assert_eq!(
            detailed.shown,
            "wasm trap: unreachable; it panicked at src/lib.rs:36:25: deliberate trap with the input 1,2,x"
        );
        assert!(!detailed.shown.contains('\n') && !quiet.logged.contains('\n'));
    }

    #[test]
    fn a_failed_allocation_is_shown_and_other_output_only_when_asked() {
        let alloc = describe("wasm trap: unreachable", "memory allocation of 1073741824 bytes failed\n", false);
        assert_eq!(alloc.shown, "wasm trap: unreachable; memory allocation of 1073741824 bytes failed");
        let other = describe("wasm trap: unreachable", "secret input\n", false);
        assert_eq!(other.shown, "wasm trap: unreachable (what it wrote to stderr is in the server's log)");
        assert_eq!(describe("r", "secret input\n", true).shown, "r; its stderr: secret input");
        assert_eq!(describe("r", "", false).shown, "r");
    }
}
