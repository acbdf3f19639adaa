//! intent-log
