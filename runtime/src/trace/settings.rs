//! The trace settings: `--trace-config` (Triton's flag,
//! `docs/user_guide/trace.md`) and the trace extension's settings
//! (`docs/protocol/extension_trace.md`: `trace_level`, `trace_rate`,
//! `trace_count`, `trace_mode`), globally and per model.

use std::collections::BTreeMap;
use std::time::Duration;

/// How much of a request is traced (Triton's `level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Nothing.
    Off,
    /// Spans with the timestamps of each stage.
    Timestamps,
}

impl Level {
    /// The level Triton's name gives.
    ///
    /// # Errors
    /// A message for `TENSORS` (which Triton's OpenTelemetry mode does not
    /// support either) and for any other name.
    pub fn parse(name: &str) -> Result<Level, String> {
        match name {
            "OFF" => Ok(Level::Off),
            "TIMESTAMPS" => Ok(Level::Timestamps),
            "TENSORS" => Err("trace level TENSORS is not supported: spans carry timestamps, not tensors \
                 (Triton's OpenTelemetry mode has the same limit); use TIMESTAMPS"
                .to_owned()),
            other => Err(format!("unknown trace level '{other}'; the levels are OFF and TIMESTAMPS")),
        }
    }

    /// Triton's name of the level.
    pub fn name(self) -> &'static str {
        match self {
            Level::Off => "OFF",
            Level::Timestamps => "TIMESTAMPS",
        }
    }
}

/// Which requests are traced: the server's, or one model's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `level`.
    pub level: Level,
    /// `rate`: one request in every `rate` is traced; 0 traces only
    /// requests that carry a sampled `traceparent`.
    pub rate: u64,
    /// `count`: how many more requests to trace by rate; -1 for no limit.
    pub count: i64,
}

impl Default for Settings {
    /// Triton's defaults: OFF, one request in 1000, no limit.
    fn default() -> Self {
        Settings { level: Level::Off, rate: 1000, count: -1 }
    }
}

/// One model's settings: each field set overrides the server's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `trace_level`, when the model sets it.
    pub level: Option<Level>,
    /// `trace_rate`, when the model sets it.
    pub rate: Option<u64>,
    /// `trace_count`, when the model sets it.
    pub count: Option<i64>,
}

impl Overrides {
    /// The settings in force for the model: its own where it has them, the
    /// server's otherwise.
    pub fn over(&self, global: Settings) -> Settings {
        Settings {
            level: self.level.unwrap_or(global.level),
            rate: self.rate.unwrap_or(global.rate),
            count: self.count.unwrap_or(global.count),
        }
    }
}

/// How spans reach the collector (OTLP's two transports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`, the default, and
    /// the only one Triton has).
    HttpProtobuf,
    /// OTLP/gRPC (`grpc`).
    Grpc,
}

/// Where and how spans are exported: `--trace-config opentelemetry,...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// `url`: the collector's endpoint (default
    /// `http://localhost:4318/v1/traces`, or `http://localhost:4317` for
    /// gRPC). A bare `host:port` gets `http://` (and for HTTP the
    /// `/v1/traces` path).
    pub url: Option<String>,
    /// `protocol`: `http/protobuf` or `grpc` (OpenTelemetry's names, as in
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub protocol: Protocol,
    /// `resource=KEY=VALUE`, each given once, in order.
    pub resource: Vec<(String, String)>,
    /// `bsp_max_queue_size`: spans waiting for export at most (2048).
    pub max_queue_size: usize,
    /// `bsp_schedule_delay`: the longest wait between exports (5000 ms).
    pub schedule_delay: Duration,
    /// `bsp_max_export_batch_size`: spans in one export at most (512).
    pub max_export_batch_size: usize,
}

impl Default for Export {
    fn default() -> Self {
        Export {
            url: None,
            protocol: Protocol::HttpProtobuf,
            resource: Vec::new(),
            max_queue_size: 2048,
            schedule_delay: Duration::from_millis(5000),
            max_export_batch_size: 512,
        }
    }
}

impl Export {
    /// The endpoint spans are sent to, completed as [`Export::url`] says.
    pub fn endpoint(&self) -> String {
        let url = self.url.clone().unwrap_or_else(|| match self.protocol {
            Protocol::HttpProtobuf => "localhost:4318".to_owned(),
            Protocol::Grpc => "localhost:4317".to_owned(),
        });
        let url = if url.contains("://") { url } else { format!("http://{url}") };
        let has_path = url.split("://").nth(1).is_some_and(|rest| rest.contains('/'));
        match self.protocol {
            Protocol::HttpProtobuf if !has_path => format!("{url}/v1/traces"),
            _ => url,
        }
    }
}

/// `--trace-config`, every entry read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceConfig {
    /// The global settings (`level`, `rate`, `count`).
    pub settings: Settings,
    /// The OpenTelemetry exporter's settings.
    pub export: Export,
}

impl TraceConfig {
    /// Reads `--trace-config` entries: `SETTING=VALUE` for the global
    /// settings (`mode`, `level`, `rate`, `count`) and
    /// `opentelemetry,SETTING=VALUE` for the exporter's (`url`,
    /// `protocol`, `resource`, `bsp_max_queue_size`, `bsp_schedule_delay`,
    /// `bsp_max_export_batch_size`).
    ///
    /// # Errors
    /// A message naming the entry for an unknown setting or mode, a value
    /// that does not parse, Triton's own trace files (`mode=triton`,
    /// `triton,...`), which Plinth does not write, or a batch larger than
    /// the queue.
    pub fn parse(entries: &[String]) -> Result<TraceConfig, String> {
        let mut config = TraceConfig::default();
        for entry in entries {
            config.apply(entry).map_err(|e| format!("--trace-config {entry}: {e}"))?;
        }
        if config.export.max_export_batch_size > config.export.max_queue_size {
            return Err(
                "--trace-config opentelemetry,bsp_max_export_batch_size must not exceed bsp_max_queue_size".to_owned()
            );
        }
        Ok(config)
    }

    fn apply(&mut self, entry: &str) -> Result<(), String> {
        let (mode, setting) = match entry.split_once(',') {
            Some((mode, rest)) if !mode.contains('=') => (Some(mode), rest),
            _ => (None, entry),
        };
        let (key, value) = setting.split_once('=').ok_or("expected SETTING=VALUE")?;
        let number = |what: &str| value.trim().parse::<u64>().map_err(|_| format!("{what} must be a whole number"));
        match (mode, key) {
            (None, "mode") if value == "opentelemetry" => {}
            (None, "mode") | (Some("triton"), _) => return Err(TRITON_MODE.to_owned()),
            (None, "level") => self.settings.level = Level::parse(value)?,
            (None, "rate") => self.settings.rate = number("rate")?,
            (None, "count") => {
                self.settings.count =
                    value.trim().parse::<i64>().ok().filter(|&n| n >= -1).ok_or("count must be -1 or more")?
            }
            (Some("opentelemetry"), "url") => self.export.url = Some(value.to_owned()),
            (Some("opentelemetry"), "protocol") => {
                self.export.protocol = match value {
                    "http/protobuf" => Protocol::HttpProtobuf,
                    "grpc" => Protocol::Grpc,
                    other => return Err(format!("unknown protocol '{other}'; use http/protobuf or grpc")),
                }
            }
            (Some("opentelemetry"), "resource") => {
                let (k, v) = value.split_once('=').ok_or("resource must be KEY=VALUE")?;
                self.export.resource.push((k.to_owned(), v.to_owned()));
            }
            (Some("opentelemetry"), "bsp_max_queue_size") => {
                self.export.max_queue_size = number("bsp_max_queue_size")?.max(1) as usize
            }
            (Some("opentelemetry"), "bsp_schedule_delay") => {
                self.export.schedule_delay = Duration::from_millis(number("bsp_schedule_delay")?)
            }
            (Some("opentelemetry"), "bsp_max_export_batch_size") => {
                self.export.max_export_batch_size = number("bsp_max_export_batch_size")?.max(1) as usize
            }
            (Some("opentelemetry"), other) => {
                return Err(format!(
                    "unknown setting '{other}'; the opentelemetry settings are url, protocol, resource, \
                     bsp_max_queue_size, bsp_schedule_delay and bsp_max_export_batch_size"
                ));
            }
            (Some(other), _) => return Err(format!("unknown trace mode '{other}'; Plinth traces with opentelemetry")),
            (None, other) => {
                return Err(format!("unknown setting '{other}'; the global settings are mode, level, rate and count"));
            }
        }
        Ok(())
    }
}

/// Why Triton's own trace mode is refused.
const TRITON_MODE: &str = "Plinth exports traces with OpenTelemetry only (mode=opentelemetry); \
    it does not write Triton's trace files (mode=triton, triton,file=..., triton,log-frequency=...)";

/// One setting of a trace extension request: its values (`[]` clears a
/// model's setting, as a JSON `null` does).
pub type Update = BTreeMap<String, Vec<String>>;

/// Applies a trace extension update to `target`, each field of which is
/// `None` where the scope does not set it. For the server's own settings
/// (`global`), a setting cannot be cleared.
///
/// # Errors
/// A message naming the setting for an unknown one, Triton's trace-file
/// settings, a value that does not parse, or clearing a global setting.
pub fn update(target: &mut Overrides, update: &Update, global: bool) -> Result<(), String> {
    for (key, values) in update {
        let single = || match values.as_slice() {
            [one] => Ok(one.as_str()),
            _ => Err(format!("setting '{key}' takes one value, got {values:?}")),
        };
        if values.is_empty() {
            if global {
                return Err(format!("setting '{key}' cannot be cleared for the server, only for a model"));
            }
            match key.as_str() {
                "trace_level" => target.level = None,
                "trace_rate" => target.rate = None,
                "trace_count" => target.count = None,
                _ => return Err(unknown(key)),
            }
            continue;
        }
        match key.as_str() {
            "trace_level" => {
                let levels = values.iter().map(|v| Level::parse(v)).collect::<Result<Vec<_>, _>>()?;
                // Several levels are Triton's way of tracing several kinds
                // of information; OFF alone turns tracing off.
                target.level = Some(if levels.contains(&Level::Timestamps) { Level::Timestamps } else { Level::Off });
            }
            "trace_rate" => {
                target.rate =
                    Some(single()?.parse().map_err(|_| format!("trace_rate must be a whole number, got {values:?}"))?)
            }
            "trace_count" => {
                target.count = Some(
                    single()?
                        .parse::<i64>()
                        .ok()
                        .filter(|&n| n >= -1)
                        .ok_or_else(|| format!("trace_count must be -1 or more, got {values:?}"))?,
                )
            }
            "trace_mode" if single()? == "opentelemetry" => {}
            "trace_mode" | "trace_file" | "log_frequency" => return Err(TRITON_MODE.to_owned()),
            other => return Err(unknown(other)),
        }
    }
    Ok(())
}

fn unknown(key: &str) -> String {
    format!("unknown trace setting '{key}'; the settings are trace_level, trace_rate, trace_count and trace_mode")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entries: &[&str]) -> Result<TraceConfig, String> {
        TraceConfig::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn triton_s_flag_shape_is_read() {
        let config = parse(&[
            "mode=opentelemetry",
            "rate=1",
            "level=TIMESTAMPS",
            "count=5",
            "opentelemetry,url=collector:4317",
            "opentelemetry,protocol=grpc",
            "opentelemetry,resource=service.name=mine",
            "opentelemetry,bsp_schedule_delay=50",
        ])
        .unwrap();
        assert_eq!(config.settings, Settings { level: Level::Timestamps, rate: 1, count: 5 });
        assert_eq!(config.export.endpoint(), "http://collector:4317");
        assert_eq!(config.export.resource, [("service.name".to_owned(), "mine".to_owned())]);
        assert_eq!(config.export.schedule_delay, Duration::from_millis(50));
        assert_eq!(parse(&[]).unwrap().export.endpoint(), "http://localhost:4318/v1/traces");
        assert_eq!(parse(&["opentelemetry,url=h:1"]).unwrap().export.endpoint(), "http://h:1/v1/traces");
    }

    #[test]
    fn what_plinth_does_not_do_is_refused_by_name() {
        assert!(parse(&["mode=triton"]).unwrap_err().contains("does not write Triton's trace files"));
        assert!(parse(&["triton,file=/tmp/t.json"]).unwrap_err().contains("mode=opentelemetry"));
        assert!(parse(&["level=TENSORS"]).unwrap_err().contains("TENSORS is not supported"));
        assert!(parse(&["rates=1"]).unwrap_err().contains("unknown setting 'rates'"));
        assert!(parse(&["opentelemetry,urls=x"]).unwrap_err().contains("unknown setting 'urls'"));
        assert!(parse(&["count=-2"]).unwrap_err().contains("count must be -1 or more"));
        assert!(parse(&["opentelemetry,bsp_max_queue_size=1"]).unwrap_err().contains("must not exceed"));
    }

    #[test]
    fn updates_set_and_clear_model_settings_and_refuse_the_rest() {
        let mut model = Overrides::default();
        let set: Update =
            [("trace_rate".to_owned(), vec!["1".to_owned()]), ("trace_level".into(), vec!["TIMESTAMPS".into()])]
                .into_iter()
                .collect();
        update(&mut model, &set, false).unwrap();
        let global = Settings::default();
        assert_eq!(model.over(global), Settings { level: Level::Timestamps, rate: 1, count: -1 });
        update(&mut model, &[("trace_rate".to_owned(), vec![])].into_iter().collect(), false).unwrap();
        assert_eq!(model.over(global).rate, 1000, "cleared: the server's again");
        let clear_global =
            update(&mut Overrides::default(), &[("trace_rate".to_owned(), vec![])].into_iter().collect(), true);
        assert!(clear_global.unwrap_err().contains("cannot be cleared"));
        let file = update(&mut model, &[("trace_file".to_owned(), vec!["x".to_owned()])].into_iter().collect(), false);
        assert!(file.unwrap_err().contains("trace files"));
    }
}
