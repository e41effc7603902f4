//! The plan of what to export: every servable field ([`catalog`]), the counters CSV that
//! picks from it ([`counters`]), and where that CSV comes from and how it is reloaded
//! ([`reload`]). The sampler and encoders follow the plan; the plan imports neither.

pub mod catalog;
pub mod counters;
pub mod reload;
