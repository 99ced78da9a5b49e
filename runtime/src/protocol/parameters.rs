//! The inference request parameters Plinth acts on, for both front ends.
//! The v2 protocol lets a request, each input and each requested output
//! carry any `parameters`; one Plinth does not act on is refused naming it,
//! rather than ignored (Triton passes them on to its backends, which may
//! read them; Plinth's backends read none).

use super::shared_memory::{BYTE_SIZE, OFFSET, REGION};
use crate::error::Error;

/// Where a parameter sits in an inference request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The request's own `parameters`.
    Request,
    /// An input's `parameters`.
    Input,
    /// A requested output's `parameters`.
    Output,
}

/// The front end a request came through: each has its own parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// HTTP/REST (JSON and binary tensor data).
    Http,
    /// gRPC (`ModelInfer`, `ModelStreamInfer`).
    Grpc,
}

/// The parameters Plinth reads at `level` through `front`.
/// `triton_enable_empty_final_response` (sent by perf_analyzer and
/// tritonclient's stream) asks a decoupled model for an empty final answer;
/// for the models Plinth serves, none decoupled, it changes nothing, as in
/// Triton.
fn known(level: Level, front: Front) -> &'static [&'static str] {
    match (level, front) {
        (Level::Request, Front::Http) => &[
            "priority",
            "timeout",
            "binary_data_output",
            "triton_enable_empty_final_response",
            "sequence_id",
            "sequence_start",
            "sequence_end",
        ],
        (Level::Request, Front::Grpc) => &[
            "priority",
            "timeout",
            "triton_enable_empty_final_response",
            "sequence_id",
            "sequence_start",
            "sequence_end",
        ],
        (Level::Input, Front::Http) => &["binary_data_size", REGION, OFFSET, BYTE_SIZE],
        (Level::Input, Front::Grpc) => &[REGION, OFFSET, BYTE_SIZE],
        (Level::Output, Front::Http) => &["binary_data", "classification", REGION, OFFSET, BYTE_SIZE],
        (Level::Output, Front::Grpc) => &["classification", REGION, OFFSET, BYTE_SIZE],
    }
}

/// Checks the `keys` of the parameters at `level` (`what` names the input
/// or output, or is empty for the request).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first parameter Plinth does not
/// act on, with the ones it does.
pub fn check<'a>(level: Level, front: Front, what: &str, keys: impl IntoIterator<Item = &'a str>) -> Result<(), Error> {
    let known = known(level, front);
    for key in keys {
        if known.contains(&key) {
            continue;
        }
        let at = if what.is_empty() { "request".to_owned() } else { what.to_owned() };
        return Err(Error::InvalidArgument(format!("unknown {at} parameter '{key}'; Plinth reads {known:?} here")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_plinth_does_not_read_are_named() {
        assert!(check(Level::Request, Front::Http, "", ["priority", "binary_data_output"]).is_ok());
        assert!(check(Level::Output, Front::Grpc, "output 'y'", ["classification", "shared_memory_region"]).is_ok());
        assert!(check(Level::Request, Front::Grpc, "", ["triton_enable_empty_final_response"]).is_ok());
        assert!(check(Level::Request, Front::Http, "", ["sequence_id", "sequence_start", "sequence_end"]).is_ok());
        let cases = [
            (Level::Request, Front::Http, "", "custom", "unknown request parameter 'custom'; Plinth reads"),
            (Level::Request, Front::Grpc, "", "binary_data_output", "unknown request parameter 'binary_data_output'"),
            (
                Level::Request,
                Front::Http,
                "",
                "shared_memory_region",
                "unknown request parameter 'shared_memory_region'",
            ),
            (Level::Output, Front::Http, "output 'y'", "binary", "unknown output 'y' parameter 'binary'"),
        ];
        for (level, front, what, key, message) in cases {
            let e = check(level, front, what, [key]).unwrap_err().to_string();
            assert!(e.starts_with(message), "{key}: {e}");
        }
    }
}
