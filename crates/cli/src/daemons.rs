//! `duplex mon` and `duplex osd`: the daemons, with an optional TOML
//! configuration file.
//!
//! A configuration file's keys are the daemon's long flag names (with `_`
//! or `-`), so the two are one interface and `--help` documents both:
//!
//! ```toml
//! # osd.0.toml
//! id = 0
//! data = "/var/lib/duplex/osd.0/store.img"
//! mon = ["1=10.0.0.1:6789"]       # a repeated flag is a list
//! allow_buffered_io = true        # a switch is a boolean
//! flush_threshold = 16
//! ```
//!
//! Flags on the command line override the file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Turns a configuration file into the flags it stands for.
pub fn config_flags(path: &Path) -> Result<Vec<OsString>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let mut flags = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        let mut push_value = |value: &toml::Value| -> Result<()> {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => {
                    bail!("{}: '{key}' must be a string, number or boolean, not {}", path.display(), other.type_str())
                }
            };
            flags.push(OsString::from(format!("{flag}={text}")));
            Ok(())
        };
        match &value {
            toml::Value::Boolean(true) => flags.push(OsString::from(flag)),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for item in items {
                    push_value(item)?;
                }
            }
            other => push_value(other)?,
        }
    }
    Ok(flags)
}

/// Parses daemon arguments of type `A`: the config file's flags first, then
/// the command line's (which win).
pub fn parse_with_config<A: clap::Parser>(name: &str, config: Option<&PathBuf>, args: &[OsString]) -> Result<A> {
    let mut argv = vec![OsString::from(name)];
    if let Some(config) = config {
        argv.extend(config_flags(config)?);
    }
    argv.extend(args.iter().cloned());
    let command = A::command().args_override_self(true);
    let matches = command.try_get_matches_from(argv).map_err(|e| anyhow::anyhow!("{e}"))?;
    A::from_arg_matches(&matches).map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Example {
        #[arg(long)]
        id: u32,
        #[arg(long = "mon")]
        monitors: Vec<String>,
        #[arg(long)]
        allow_buffered_io: bool,
        #[arg(long, default_value_t = 16)]
        flush_threshold: usize,
    }

    #[test]
    fn config_files_become_flags_and_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("osd.toml");
        std::fs::write(&path, "id = 3\nmon = [\"1=127.0.0.1:1\", \"2=127.0.0.1:2\"]\nallow_buffered_io = true\n")
            .unwrap();
        let args: Example = parse_with_config("osd", Some(&path), &["--id".into(), "4".into()]).unwrap();
        assert_eq!(args.id, 4);
        assert_eq!(args.monitors.len(), 2);
        assert!(args.allow_buffered_io);
        assert_eq!(args.flush_threshold, 16);
        std::fs::write(&path, "idd = 3\n").unwrap();
        let err = parse_with_config::<Example>("osd", Some(&path), &[]).unwrap_err().to_string();
        assert!(err.contains("--idd"), "{err}");
    }
}
