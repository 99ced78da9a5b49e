//! The log and its settings at run time: Triton's logging extension
//! (`docs/protocol/extension_logging.md`, `GET`/`POST /v2/logging` and the
//! gRPC `LogSettings`). The level can change while serving; the format and
//! the destination (stderr) are set at start.

use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::error::Error;

/// `--log-format` values: Triton's `default` and `ISO8601` (both print an
/// ISO 8601 timestamp here), and `json` lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Default,
    /// Human-readable lines (Triton's name; timestamps are ISO 8601 anyway).
    #[value(name = "ISO8601", alias = "iso8601")]
    Iso8601,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The name the logging extension uses.
    fn name(self) -> &'static str {
        match self {
            LogFormat::Default => "default",
            LogFormat::Iso8601 => "ISO8601",
            LogFormat::Json => "json",
        }
    }
}

/// What the logging extension reports and sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Settings {
    info: bool,
    warning: bool,
    error: bool,
    verbose: u32,
    format: LogFormat,
}

impl Settings {
    /// The filter that logs what these settings ask for. Levels nest (error
    /// ⊂ warning ⊂ info ⊂ verbose), so a setting that leaves a hole (info
    /// without warnings) cannot be expressed and is refused before this.
    fn filter(self) -> EnvFilter {
        let level = match (self.verbose, self.info, self.warning, self.error) {
            (v, _, _, _) if v >= 2 => "trace",
            (1, _, _, _) => "debug",
            (_, true, _, _) => "info",
            (_, false, true, _) => "warn",
            (_, false, false, true) => "error",
            _ => "off",
        };
        EnvFilter::new(format!("warn,plinth={level}"))
    }

    fn to_json(self) -> Value {
        json!({
            "log_file": "",
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose,
            "log_format": self.format.name(),
        })
    }
}

/// stderr, one record per line: a newline inside a record (a message or
/// field that quotes several lines) is written as `\n`, so that line-based
/// log shipping sees one record per line. tracing-subscriber formats a
/// whole record and writes it with one `write_all`, which is one `write`
/// here.
struct OneLine;

impl std::io::Write for OneLine {
    fn write(&mut self, record: &[u8]) -> std::io::Result<usize> {
        let body = record.strip_suffix(b"\n").unwrap_or(record);
        let mut stderr = std::io::stderr().lock();
        if !body.contains(&b'\n') {
            stderr.write_all(record)?;
            return Ok(record.len());
        }
        let mut line = Vec::with_capacity(record.len() + 16);
        for &byte in body {
            match byte {
                b'\n' => line.extend_from_slice(b"\\n"),
                other => line.push(other),
            }
        }
        line.extend_from_slice(&record[body.len()..]);
        stderr.write_all(&line)?;
        Ok(record.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// The running log: its settings and the handle that changes its level.
pub struct Logging {
    settings: Mutex<Settings>,
    filter: reload::Handle<EnvFilter, Registry>,
}

impl Logging {
    /// Starts logging to stderr as `--log-verbose` and `--log-format` ask;
    /// `RUST_LOG`, when set, decides the level until the settings change.
    pub fn init(verbose: u8, format: LogFormat) -> Logging {
        let settings = Settings { info: true, warning: true, error: true, verbose: u32::from(verbose), format };
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| settings.filter());
        let (filter, handle) = reload::Layer::new(filter);
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let lines = tracing_subscriber::fmt::layer().with_writer(|| OneLine).with_ansi(ansi);
        let registry = tracing_subscriber::registry().with(filter);
        match format {
            LogFormat::Default | LogFormat::Iso8601 => registry.with(lines).init(),
            LogFormat::Json => registry.with(lines.json()).init(),
        }
        Logging { settings: Mutex::new(settings), filter: handle }
    }

    /// The settings as the logging extension reports them: `log_file`,
    /// `log_info`, `log_warning`, `log_error`, `log_verbose_level`,
    /// `log_format`.
    pub fn settings(&self) -> Value {
        self.settings.lock().to_json()
    }

    /// Applies the settings in `update` and returns them all.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming a setting that is unknown, of the
    /// wrong type, asks for a log file or another format (both are set at
    /// start), or leaves a hole in the levels (warnings off with info on,
    /// errors off with warnings on); nothing changes then.
    pub fn update(&self, update: &Map<String, Value>) -> Result<Value, Error> {
        let mut settings = self.settings.lock();
        let mut next = *settings;
        for (key, value) in update {
            let flag = || {
                value.as_bool().ok_or_else(|| bad(format!("log setting '{key}' must be true or false, got {value}")))
            };
            match key.as_str() {
                "log_info" => next.info = flag()?,
                "log_warning" => next.warning = flag()?,
                "log_error" => next.error = flag()?,
                "log_verbose_level" => {
                    next.verbose = value.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| {
                        bad(format!("log setting 'log_verbose_level' must be a whole number, got {value}"))
                    })?
                }
                "log_file" if value.as_str() == Some("") => {}
                "log_file" => {
                    return Err(bad(format!(
                        "log setting 'log_file' cannot be set: Plinth logs to stderr, got {value}"
                    )));
                }
                "log_format" if value.as_str() == Some(settings.format.name()) => {}
                "log_format" => {
                    return Err(bad(format!(
                        "log setting 'log_format' is '{}' (--log-format) and cannot change while serving, got {value}",
                        settings.format.name()
                    )));
                }
                other => {
                    return Err(bad(format!(
                        "unknown log setting '{other}'; the settings are log_file, log_info, log_warning, log_error, log_verbose_level and log_format"
                    )));
                }
            }
        }
        if (next.info && !next.warning) || (next.warning && !next.error) {
            return Err(bad(
                "log levels nest in Plinth: info needs log_warning, and warnings need log_error".to_owned()
            ));
        }
        if next != *settings {
            self.filter
                .reload(next.filter())
                .map_err(|e| Error::Internal(format!("cannot change the log level: {e}")))?;
            *settings = next;
        }
        Ok(settings.to_json())
    }
}

fn bad(message: String) -> Error {
    Error::InvalidArgument(message)
}
