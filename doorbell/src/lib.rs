//! doorbell (skeleton)
