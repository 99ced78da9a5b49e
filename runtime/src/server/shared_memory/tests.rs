use super::*;

/// A shared memory object of `size` zero bytes, removed on drop.
struct Object(String);

impl Object {
    fn new(tag: &str, size: u64) -> Object {
        let key = format!("/plinth_test_{tag}_{}", std::process::id());
        File::create(PathBuf::from(SHM_DIR).join(&key[1..])).unwrap().set_len(size).unwrap();
        Object(key)
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(PathBuf::from(SHM_DIR).join(&self.0[1..]));
    }
}

fn at(region: &str, offset: u64, byte_size: u64) -> RegionRef {
    RegionRef { region: region.into(), offset, byte_size }
}

#[test]
fn tensors_go_through_a_registered_range() {
    let object = Object::new("range", 4096 + 64);
    let shm = SharedMemory::new(true, u64::MAX, SharedMemoryMetrics::detached());
    shm.register("r", &object.0, 4096, 64).unwrap();
    let out = shm.output(at("r", 8, 8)).unwrap();
    out.write("y", &[1, 2, 3, 4]).unwrap();
    assert_eq!(shm.reads().read(&at("r", 8, 4)).unwrap(), [1, 2, 3, 4]);
    let e = out.write("y", &[0; 9]).unwrap_err().to_string();
    assert!(e.contains("output 'y' (8 bytes) should be at least 9 bytes"), "{e}");
    let file = std::fs::read(PathBuf::from(SHM_DIR).join(&object.0[1..])).unwrap();
    assert_eq!(&file[4096 + 8..4096 + 12], &[1, 2, 3, 4], "the region starts at its offset in the object");
    assert_eq!(
        shm.status(None).unwrap()[0],
        RegionStatus { name: "r".into(), key: object.0.clone(), offset: 4096, byte_size: 64 }
    );
}

#[test]
fn ranges_and_registrations_are_checked_with_triton_texts() {
    let object = Object::new("checks", 64);
    let shm = SharedMemory::new(true, u64::MAX, SharedMemoryMetrics::detached());
    for (offset, size) in [(0, 65), (1, 64), (64, 1), (0, 0)] {
        let e = shm.register("r", &object.0, offset, size).unwrap_err().to_string();
        assert!(e.starts_with("failed to register shared memory region 'r': invalid args"), "{e}");
    }
    shm.register("r", &object.0, 0, 64).unwrap();
    let again = shm.register("r", &object.0, 0, 64).unwrap_err();
    assert_eq!(again, Error::AlreadyExists("shared memory region 'r' already in manager".into()));
    let cases = [
        (at("nope", 0, 4), "Unable to find shared memory region: 'nope'"),
        (at("r", 64, 4), "Invalid offset for shared memory region: 'r'"),
        (at("r", 1, 64), "Invalid offset + byte size for shared memory region: 'r'"),
        (at("r", 32, u64::MAX - 31), "Integer overflow detected: byte_size (18446744073709551584) + offset (32)"),
    ];
    for (place, message) in cases {
        let e = shm.reads().read(&place).unwrap_err().to_string();
        assert!(e.starts_with(message), "{e}");
    }
    for key in ["/", "///"] {
        let e = shm.register("k", key, 0, 1).unwrap_err().to_string();
        assert_eq!(e, format!("cannot register shared memory region 'k' - invalid shm key '{key}'"));
    }
    let e = shm.register("k", "//triton_python_backend_shm_region_x", 0, 1).unwrap_err().to_string();
    assert!(e.contains("as the key contains the reserved prefix"), "{e}");
    let e = shm.register("k", "/plinth_no_such_key", 0, 1).unwrap_err();
    assert!(
        matches!(&e, Error::Internal(m) if m.starts_with("Unable to open shared memory region: '/plinth_no_such_key'"))
    );
}

#[test]
fn unregistering_is_idempotent_and_needs_the_flag() {
    let object = Object::new("unregister", 64);
    let shm = SharedMemory::new(true, u64::MAX, SharedMemoryMetrics::detached());
    shm.unregister(Some("never")).unwrap();
    shm.register("a", &object.0, 0, 64).unwrap();
    shm.register("b", &object.0, 0, 32).unwrap();
    let held = shm.output(at("a", 0, 4)).unwrap();
    let also = shm.output(at("a", 4, 4)).unwrap();
    shm.unregister(Some("a")).unwrap();
    held.write("y", &[9; 4]).unwrap();
    assert_eq!(shm.status(None).unwrap().len(), 2, "a held region stays until its requests are done");
    assert!(shm.reads().read(&at("a", 0, 4)).is_ok(), "and is still usable");
    assert!(matches!(shm.register("a", &object.0, 0, 64), Err(Error::AlreadyExists(_))));
    drop(held);
    assert_eq!(shm.status(None).unwrap().len(), 2);
    drop(also);
    assert_eq!(shm.status(None).unwrap().len(), 1, "gone with its last request");
    shm.unregister(None).unwrap();
    assert!(shm.status(None).unwrap().is_empty());
    assert!(matches!(shm.status(Some("a")), Err(Error::NotFound(_))));

    let off = SharedMemory::new(false, u64::MAX, SharedMemoryMetrics::detached());
    for e in [off.register("a", &object.0, 0, 64).unwrap_err(), off.unregister(None).unwrap_err()] {
        assert!(e.to_string().starts_with("Client shared memory is disabled."), "{e}");
    }
    assert!(off.status(None).unwrap().is_empty());
}

#[test]
fn one_request_reads_at_most_its_limit_and_its_copies_count_as_held() {
    let object = Object::new("limit", 4096);
    let metrics = crate::metrics::Metrics::new();
    let shm = SharedMemory::new(true, 1000, metrics.shared_memory.clone());
    shm.register("r", &object.0, 0, 4096).unwrap();
    let held = |m: &crate::metrics::Metrics| {
        let text = m.render();
        let prefix = "plinth_shared_memory_held_bytes{region=\"r\"} ";
        text.lines().find_map(|l| l.strip_prefix(prefix)).map(|v| v.parse::<i64>().unwrap())
    };
    assert_eq!(held(&metrics), Some(0));
    let reads = shm.reads();
    assert_eq!(reads.read(&at("r", 0, 600)).unwrap().len(), 600);
    let e = reads.read(&at("r", 600, 401)).unwrap_err().to_string();
    assert_eq!(
        e,
        "reading 401 bytes from shared memory region 'r' would bring this request's inputs from shared memory to \
         1001 bytes, more than the 1000 bytes one request may read (--shm-max-input-bytes)"
    );
    let e = shm.reads().read(&at("r", 0, 4096)).unwrap_err().to_string();
    assert!(e.contains("more than the 1000 bytes one request may read"), "{e}");
    let output = shm.output(at("r", 1000, 100)).unwrap();
    let request = reads.into_held();
    assert_eq!(held(&metrics), Some(700), "the input's copy and the output's place");
    drop((request, output));
    assert_eq!(held(&metrics), Some(0));
    shm.unregister(Some("r")).unwrap();
    assert_eq!(held(&metrics), None, "the series leaves with the region");
}
