//! Serving: the HTTP endpoints ([`http`]), who may use them ([`access`]) and the
//! exporter-toolkit web configuration that sets TLS and authentication ([`web_config`]).
//! Serving reads snapshots and encoders' output; nothing upstream imports it.

pub mod access;
pub mod http;
pub mod web_config;
