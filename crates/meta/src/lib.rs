//! meta
