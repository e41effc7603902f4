//! The web config file (`--web-config-file`, exporter-toolkit's YAML).
//! Invariant: a valid configuration names itself first among its files.
#![no_main]

use gpu_exporter::serving::web_config::WebConfig;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|text: &str| {
    let path = Path::new("/nonexistent/fuzz/web.yml");
    if let Ok(config) = WebConfig::parse(text, path) {
        assert_eq!(config.files().first().map(|p| p.as_path()), Some(path));
    }
});
