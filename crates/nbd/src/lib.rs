//! nbd
