//! Triton's system shared memory extension
//! (`docs/protocol/extension_shared_memory.md`): a client registers a byte
//! range of a POSIX shared memory object under a name, then sends inputs
//! and receives outputs through it instead of the request and response
//! bodies. Registration needs `--allow-client-shm=true`, as in Triton.
//!
//! The object stays open from registration to unregistration, so a client
//! that unlinks and recreates its key meanwhile does not change what the
//! region reads. One request's inputs may read at most
//! `--shm-max-input-bytes` from the regions together (the counterpart of
//! `--http-max-body-bytes`: an input is copied out of its region, so a
//! client could otherwise make the server allocate as much as it
//! registered), and the bytes each region's requests hold are counted
//! (`plinth_shared_memory_held_bytes`). A request holds each region it reads or writes until it
//! is done with it; unregistering a region that requests hold succeeds but
//! takes effect when the last of them lets go (as Triton defers it): until
//! then the region is still listed, still usable, and its name still taken.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use prometheus::IntGauge;

use crate::error::Error;
use crate::metrics::SharedMemoryMetrics;
use crate::protocol::request::RequestedOutput;
use crate::protocol::shared_memory::{RegionRef, Regions};
use crate::tensor::Tensor;

/// Where POSIX `shm_open` keeps its objects on Linux: key `/k` is the file
/// `/dev/shm/k`.
const SHM_DIR: &str = "/dev/shm";

/// Why the CUDA shared memory extension's calls are refused (HTTP 501,
/// gRPC UNIMPLEMENTED).
pub const CUDA_UNSUPPORTED: &str =
    "CUDA shared memory is not supported: Plinth shares system memory only (/v2/systemsharedmemory)";

/// Keys Triton's Python backend keeps for itself; refused as Triton does.
const RESERVED_PREFIX: &str = "triton_python_backend_shm_region_";

/// The registered regions, by name.
pub struct SharedMemory {
    /// `--allow-client-shm`: whether clients may register and unregister.
    allowed: bool,
    /// `--shm-max-input-bytes`: what one request's inputs may read, in all.
    max_input_bytes: u64,
    table: Arc<Table>,
    metrics: SharedMemoryMetrics,
}

/// The regions by name; each entry's `Arc` count is 1 plus the requests
/// holding it.
type Table = Mutex<BTreeMap<String, Arc<Region>>>;

/// One registered region: `byte_size` bytes from `offset` of the object
/// `key`.
struct Region {
    key: String,
    offset: u64,
    byte_size: u64,
    file: File,
    /// Unregistered while requests held it: removed when the last lets go.
    awaiting_unregister: AtomicBool,
    /// The bytes of it requests hold (`plinth_shared_memory_held_bytes`).
    held_bytes: IntGauge,
    /// Where that series lives, to take it out at unregistration.
    metrics: SharedMemoryMetrics,
}

/// Bytes of a region a request holds, counted in its gauge until dropped.
struct HeldBytes {
    bytes: i64,
    gauge: IntGauge,
}

impl HeldBytes {
    fn new(region: &Region, bytes: u64) -> HeldBytes {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        region.held_bytes.add(bytes);
        HeldBytes { bytes, gauge: region.held_bytes.clone() }
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.gauge.sub(self.bytes);
    }
}

/// A region a request holds while it reads or writes it.
struct Held {
    name: String,
    /// `Some` until dropped: taken out under the table's lock, so that
    /// exactly one holder sees itself as the last.
    region: Option<Arc<Region>>,
    table: Arc<Table>,
}

impl Held {
    fn region(&self) -> &Region {
        self.region.as_ref().expect("held until dropped")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut table = lock(&self.table);
        let region = self.region.take().expect("dropped once");
        if region.awaiting_unregister.load(Ordering::Acquire) {
            let ours = Arc::as_ptr(&region);
            drop(region);
            let last = table.get(&self.name).is_some_and(|r| Arc::as_ptr(r) == ours && Arc::strong_count(r) == 1);
            if last {
                if let Some(gone) = table.remove(&self.name) {
                    gone.forget(&self.name);
                }
                tracing::info!(name = %self.name, "unregistered system shared memory region, its last request done");
            }
        }
    }
}

fn lock(table: &Table) -> MutexGuard<'_, BTreeMap<String, Arc<Region>>> {
    table.lock()
}

/// A region as the status APIs list it (offsets and sizes in bytes).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RegionStatus {
    /// The name it was registered under.
    pub name: String,
    /// The shared memory object's key.
    pub key: String,
    /// Where in the object the region starts.
    pub offset: u64,
    /// The region's size.
    pub byte_size: u64,
}

/// An output's place in a region, resolved when its request is decoded and
/// written once the request is answered; the region is held until then.
pub struct OutputRegion {
    held: Held,
    at: RegionRef,
    _bytes: HeldBytes,
}

impl Region {
    /// Takes the series of the region, registered as `name`, out of the
    /// metrics: it is unregistered.
    fn forget(&self, name: &str) {
        self.metrics.forget(name);
    }
}

impl SharedMemory {
    /// No regions; registration allowed when `allowed`
    /// (`--allow-client-shm`); one request's inputs read at most
    /// `max_input_bytes` from the regions (`--shm-max-input-bytes`); the
    /// bytes requests hold counted in `metrics`.
    pub fn new(allowed: bool, max_input_bytes: u64, metrics: SharedMemoryMetrics) -> SharedMemory {
        SharedMemory { allowed, max_input_bytes, table: Arc::new(Mutex::new(BTreeMap::new())), metrics }
    }

    /// Decodes one request with `decode`, which reads the request's inputs
    /// from the regions (their bytes held by the regions until the answer
    /// is sent), and checks the places its requested outputs (`outputs` of
    /// the decoded request) name, before the model runs. HTTP and gRPC
    /// requests alike.
    ///
    /// # Errors
    /// `decode`'s, and [`SharedMemory::output`]'s for a place.
    pub fn decode<D>(
        &self,
        decode: impl FnOnce(&dyn Regions) -> Result<D, Error>,
        outputs: impl FnOnce(&D) -> &[RequestedOutput],
    ) -> Result<(D, RequestRegions), Error> {
        let reads = self.reads();
        let decoded = decode(&reads)?;
        let mut places = Vec::new();
        for o in outputs(&decoded) {
            if let Some(at) = &o.region {
                places.push((o.name.clone(), self.output(at.clone())?));
            }
        }
        Ok((decoded, RequestRegions { places, _inputs: reads.into_held() }))
    }

    /// The regions as one request reads its inputs from them: at most
    /// `--shm-max-input-bytes` in all, each copy counted as held by its
    /// region until the reads are dropped (when the request is answered).
    pub fn reads(&self) -> InputReads<'_> {
        InputReads { shared_memory: self, read: AtomicU64::new(0), held: Mutex::new(Vec::new()) }
    }

    fn check_allowed(&self) -> Result<(), Error> {
        if self.allowed {
            Ok(())
        } else {
            // Triton's text (`shared_memory_manager.cc`).
            Err(Error::Unsupported(
                "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.".into(),
            ))
        }
    }

    /// Registers `byte_size` bytes from `offset` of the object `key` (a
    /// POSIX shared memory key, `/name`) as the region `name`.
    ///
    /// # Errors
    /// With Triton's texts: [`Error::Unsupported`] without
    /// `--allow-client-shm`; [`Error::InvalidArgument`] for a key that is
    /// all slashes or reserved, or a range past the object's end;
    /// [`Error::AlreadyExists`] for a name already registered;
    /// [`Error::Internal`] when the object cannot be opened.
    pub fn register(&self, name: &str, key: &str, offset: u64, byte_size: u64) -> Result<(), Error> {
        self.check_allowed()?;
        let file_name = key.trim_start_matches('/');
        if file_name.is_empty() || file_name.contains('/') {
            return Err(Error::InvalidArgument(format!(
                "cannot register shared memory region '{name}' - invalid shm key '{key}'"
            )));
        }
        if file_name.starts_with(RESERVED_PREFIX) {
            return Err(Error::InvalidArgument(format!(
                "cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved \
                 prefix '{RESERVED_PREFIX}'"
            )));
        }
        let mut regions = lock(&self.table);
        if regions.contains_key(name) {
            return Err(Error::AlreadyExists(format!("shared memory region '{name}' already in manager")));
        }
        let path = PathBuf::from(SHM_DIR).join(file_name);
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::Internal(format!("Unable to open shared memory region: '{key}' ({e})")))?;
        let size =
            file.metadata().map_err(|e| Error::Internal(format!("Invalid shared memory region: '{key}' ({e})")))?.len();
        if byte_size == 0 || offset.checked_add(byte_size).is_none_or(|end| end > size) {
            return Err(Error::InvalidArgument(format!(
                "failed to register shared memory region '{name}': invalid args (offset {offset} and byte_size \
                 {byte_size} in an object of {size} bytes)"
            )));
        }
        let region = Region {
            key: key.to_owned(),
            offset,
            byte_size,
            file,
            awaiting_unregister: AtomicBool::new(false),
            held_bytes: self.metrics.region(name),
            metrics: self.metrics.clone(),
        };
        regions.insert(name.to_owned(), Arc::new(region));
        tracing::info!(name, key, offset, byte_size, "registered system shared memory region");
        Ok(())
    }

    /// Unregisters CUDA shared memory regions (one by name, or all): there
    /// never are any, since registering one is refused, so there is
    /// nothing to do. Answering success lets clients clear both kinds of
    /// region before a run, as Triton's tests and tools do.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without `--allow-client-shm`, as for system
    /// regions.
    pub fn unregister_cuda(&self) -> Result<(), Error> {
        self.check_allowed()
    }

    /// Unregisters the region `name`, or every region for `None`. A name not
    /// registered is no error (Triton's behaviour, which clients rely on to
    /// clear a name before registering it). A region requests hold stays
    /// until the last of them is done with it.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without `--allow-client-shm`.
    pub fn unregister(&self, name: Option<&str>) -> Result<(), Error> {
        self.check_allowed()?;
        let mut regions = lock(&self.table);
        regions.retain(|n, region| {
            if name.is_some_and(|name| name != n) {
                return true;
            }
            let in_use = Arc::strong_count(region) > 1;
            if in_use {
                region.awaiting_unregister.store(true, Ordering::Release);
                tracing::info!(name = %n, "system shared memory region in use: unregistered when its requests are done");
            } else {
                region.forget(n);
            }
            in_use
        });
        Ok(())
    }

    /// The region `name`, or every region (by name) for `None`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a name not registered (Triton's text).
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>, Error> {
        let regions = lock(&self.table);
        let status = |(name, r): (&String, &Arc<Region>)| RegionStatus {
            name: name.clone(),
            key: r.key.clone(),
            offset: r.offset,
            byte_size: r.byte_size,
        };
        match name {
            None => Ok(regions.iter().map(status).collect()),
            Some(name) => regions
                .get_key_value(name)
                .map(|entry| vec![status(entry)])
                .ok_or_else(|| Error::NotFound(format!("Unable to find system shared memory region: '{name}'"))),
        }
    }

    /// The region and range `at` names, checked as Triton checks it, held.
    fn resolve(&self, at: &RegionRef) -> Result<Held, Error> {
        let regions = lock(&self.table);
        let name = &at.region;
        let region = regions
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("Unable to find shared memory region: '{name}'")))?;
        if at.offset >= region.byte_size {
            return Err(Error::InvalidArgument(format!("Invalid offset for shared memory region: '{name}'")));
        }
        let Some(end) = at.offset.checked_add(at.byte_size) else {
            return Err(Error::InvalidArgument(format!(
                "Integer overflow detected: byte_size ({}) + offset ({}) exceeds maximum value ({}) for region '{name}'",
                at.byte_size,
                at.offset,
                u64::MAX
            )));
        };
        if end > region.byte_size {
            return Err(Error::InvalidArgument(format!(
                "Invalid offset + byte size for shared memory region: '{name}'"
            )));
        }
        Ok(Held { name: name.clone(), region: Some(region.clone()), table: self.table.clone() })
    }

    /// The place of an output `at` names, to be written with
    /// [`OutputRegion::write`] once the request is answered.
    ///
    /// # Errors
    /// As [`Regions::read`].
    pub fn output(&self, at: RegionRef) -> Result<OutputRegion, Error> {
        let held = self.resolve(&at)?;
        let bytes = HeldBytes::new(held.region(), at.byte_size);
        Ok(OutputRegion { held, at, _bytes: bytes })
    }
}

/// One request's reads of its inputs from the regions: at most the
/// server's `--shm-max-input-bytes` in all, each copy counted as held by
/// its region while this lives.
pub struct InputReads<'a> {
    shared_memory: &'a SharedMemory,
    /// Bytes read so far.
    read: AtomicU64,
    /// The bytes held, one entry per input read.
    held: Mutex<Vec<HeldBytes>>,
}

impl InputReads<'_> {
    /// The bytes held until the request is answered, apart from the
    /// registry (a request outlives the borrow its decoding took).
    fn into_held(self) -> HeldInputs {
        HeldInputs { _held: self.held.into_inner() }
    }
}

/// The bytes of shared memory a request's inputs were copied from, counted
/// as held by their regions until dropped.
pub struct HeldInputs {
    _held: Vec<HeldBytes>,
}

impl Regions for InputReads<'_> {
    fn check(&self, at: &RegionRef) -> Result<(), Error> {
        self.shared_memory.resolve(at).map(drop)
    }

    fn read(&self, at: &RegionRef) -> Result<Vec<u8>, Error> {
        let held = self.shared_memory.resolve(at)?;
        let max = self.shared_memory.max_input_bytes;
        let before = self.read.fetch_add(at.byte_size, Ordering::Relaxed);
        let total = before.saturating_add(at.byte_size);
        if total > max {
            return Err(Error::InvalidArgument(format!(
                "reading {} bytes from shared memory region '{}' would bring this request's inputs from shared memory \
                 to {total} bytes, more than the {max} bytes one request may read (--shm-max-input-bytes)",
                at.byte_size, at.region
            )));
        }
        let region = held.region();
        let bytes = HeldBytes::new(region, at.byte_size);
        let mut data = vec![0; at.byte_size as usize];
        region
            .file
            .read_exact_at(&mut data, region.offset + at.offset)
            .map_err(|e| Error::Internal(format!("reading shared memory region '{}': {e}", at.region)))?;
        self.held.lock().push(bytes);
        Ok(data)
    }
}

impl OutputRegion {
    /// Writes the output `name`'s `data` (raw, or serialised BYTES) at its
    /// place; data shorter than the place leaves the rest as it was.
    ///
    /// # Errors
    /// [`Error::Internal`] when the output is larger than the place the
    /// request gave it (Triton's text) or the write fails.
    pub fn write(&self, name: &str, data: &[u8]) -> Result<(), Error> {
        if data.len() as u64 > self.at.byte_size {
            return Err(Error::Internal(format!(
                "shared memory size specified with the request for output '{name}' ({} bytes) should be at least {} \
                 bytes to hold the results",
                self.at.byte_size,
                data.len()
            )));
        }
        let region = self.held.region();
        region.file.write_all_at(data, region.offset + self.at.offset).map_err(|e| {
            Error::Internal(format!("writing output '{name}' to shared memory region '{}': {e}", self.at.region))
        })
    }
}

/// One request's shared memory ([`SharedMemory::decode`]): the input
/// bytes it read, held by their regions while this lives, and the places
/// of its outputs, by output name.
pub struct RequestRegions {
    places: Vec<(String, OutputRegion)>,
    _inputs: HeldInputs,
}

impl RequestRegions {
    /// Whether output `name` goes to shared memory.
    pub fn contains(&self, name: &str) -> bool {
        self.places.iter().any(|(n, _)| n == name)
    }

    /// Writes `tensor` to its place; `false` when it has none (it goes back
    /// in the response).
    ///
    /// # Errors
    /// As [`OutputRegion::write`].
    pub fn write(&self, tensor: &Tensor) -> Result<bool, Error> {
        match self.places.iter().find(|(n, _)| *n == tensor.name) {
            Some((_, place)) => place.write(&tensor.name, &tensor.data).map(|()| true),
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests;
