//! dataset
