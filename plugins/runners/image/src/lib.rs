//! `mst/runner/image`: the runner an organisation copies to ship its private image. It picks an
//! image and limits from its options and returns a container spec; the host creates, hardens,
//! talks to and removes the container with its Docker runner code, so this plugin needs no
//! capabilities at all.
//!
//! Options: `image` (required), `context` (a Docker context or endpoint), `memoryMb`, `cpus`,
//! `network` (`bridge`, `none` or a named network), `env` (comma-separated names of environment
//! variables the containers get, from those the operator passes with `--allow-env`).

use mst_sdk::runner::{
    ContainerSpec, ErrorCode, Machine, MachineSpec, PluginError, PluginInfo, Runner, Shard,
};
use serde::Deserialize;

/// The `image` runner.
pub struct Image;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    image: String,
    context: Option<String>,
    memory_mb: Option<u64>,
    cpus: Option<f64>,
    network: Option<String>,
    env: Option<String>,
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "required": ["image"],
  "properties": {
    "image": {"type": "string", "minLength": 1},
    "context": {"type": "string"},
    "memoryMb": {"type": "integer", "minimum": 6},
    "cpus": {"type": "number", "exclusiveMinimum": 0},
    "network": {"type": "string"},
    "env": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$"}
  }
}"#;

fn parse(options: &str) -> Result<Options, PluginError> {
    serde_json::from_str(options).map_err(|e| PluginError {
        code: ErrorCode::InvalidOptions,
        message: e.to_string(),
    })
}

impl Runner for Image {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "mst/runner/image".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Shards in containers of one image, hardened by the host".into(),
            capabilities: Vec::new(),
            options_schema: Some(SCHEMA.into()),
        }
    }

    fn check_options(options: &str) -> Result<(), PluginError> {
        parse(options).map(|_| ())
    }

    fn create_machine(shard: Shard, options: &str) -> Result<Machine, PluginError> {
        let options = parse(options)?;
        Ok(Machine {
            // The host names and removes the container; the id is only for our own records.
            id: format!("{}-{}", shard.run_id, shard.index),
            description: format!("{} (image runner)", options.image),
            spec: MachineSpec::Container(ContainerSpec {
                image: options.image,
                context: options.context,
                memory_bytes: options.memory_mb.map(|mb| mb << 20),
                cpus: options.cpus,
                env_names: options
                    .env
                    .iter()
                    .flat_map(|names| names.split(','))
                    .map(String::from)
                    .collect(),
                network: options.network,
                labels: vec![("org.example.team".into(), "evals".into())],
            }),
        })
    }

    fn dispose_machine(_id: &str, _keep: bool) -> Result<(), PluginError> {
        // Nothing to release: the host removes (or keeps) the container itself.
        Ok(())
    }
}

mst_sdk::export_runner!(Image);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_spec_from_the_options() {
        let shard = Shard {
            index: 2,
            count: 4,
            run_id: "r1".into(),
        };
        let machine = Image::create_machine(
            shard,
            r#"{"image":"acme/agents:7","memoryMb":512,"env":"TZ,LANG"}"#,
        )
        .unwrap();
        let MachineSpec::Container(spec) = machine.spec else {
            panic!("a container");
        };
        assert_eq!(spec.image, "acme/agents:7");
        assert_eq!(spec.memory_bytes, Some(512 << 20));
        assert_eq!(spec.env_names, ["TZ", "LANG"]);
        assert!(Image::check_options(r#"{"image":"x","privileged":true}"#).is_err());
        assert!(Image::check_options("{}").is_err(), "image is required");
    }
}
