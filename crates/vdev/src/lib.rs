//! vdev
