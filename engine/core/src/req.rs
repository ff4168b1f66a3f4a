//! A request's identity, the key every layer of the deployment core files requests under. Its
//! own module so that the modules keying on it (the device seam, the MTP draws, the id maps)
//! need not import one another.

/// A request's identity across the whole deployment.
pub type ReqId = u64;
