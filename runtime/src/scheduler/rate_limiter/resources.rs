//! The resources of Triton's rate limiter: what each instance needs while
//! it executes, and how many copies of each resource the server has. A
//! resource is global (one set of copies for the whole server) or per
//! device (one set on each device, the CPU being one). The copies default
//! to the most any registered instance needs; `--rate-limit-resource`
//! gives them explicitly, and then a resource it does not give has none.
//! The checks and their texts are Triton's (`src/rate_limiter.cc` in
//! triton-inference-server/core, `ResourceManager`).

use std::collections::BTreeMap;
use std::str::FromStr;

/// Where an instance runs, for its per-device resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Device {
    /// The host's CPUs.
    Cpu,
    /// The GPU of this index.
    Gpu(u32),
}

/// Where the copies of a resource live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// One set of copies for the whole server (`global: true`).
    Global,
    /// One set of copies on each device.
    Device(Device),
}

/// A resource in one scope.
pub type Key = (Scope, String);

/// What one instance needs of each resource while it executes.
pub type Needs = BTreeMap<Key, u32>;

/// `--rate-limit-resource NAME:COUNT[:DEVICE]`: `count` copies of resource
/// `name` on GPU `device`, or on every device (and for a global resource,
/// the server) without one. The name matches the models' resource names
/// as written, case and all, as in Triton (whose parser reads the value as
/// given: the lower-cased copy it makes is never used).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceCount {
    /// The resource's name, as given.
    pub name: String,
    /// How many copies.
    pub count: u32,
    /// The GPU they are on; `None`: every device.
    pub device: Option<u32>,
}

impl FromStr for ResourceCount {
    type Err = String;

    /// Parses Triton's `<resource_name>:<count>[:<device>]`.
    ///
    /// # Errors
    /// Triton's text for another shape; an empty name; a count that is not
    /// a whole number of 1 or more (no copies would let no instance that
    /// needs the resource ever run); a device that is not a number.
    fn from_str(text: &str) -> Result<ResourceCount, String> {
        let shape = || {
            format!(
                "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or \
                 '<resource_name>:<count>'. Got {text}"
            )
        };
        let parts: Vec<&str> = text.split(':').collect();
        let (name, count, device) = match parts[..] {
            [name, count] => (name, count, None),
            [name, count, device] => (name, count, Some(device)),
            _ => return Err(shape()),
        };
        let number = |what: &str, v: &str| {
            v.trim().parse::<u32>().map_err(|_| format!("{}: {what} '{v}' is not a whole number", shape()))
        };
        if name.trim().is_empty() {
            return Err(format!("{}: the resource name is empty", shape()));
        }
        let count = number("count", count)?;
        if count == 0 {
            return Err(format!("{}: count must be 1 or more", shape()));
        }
        Ok(ResourceCount { name: name.to_owned(), count, device: device.map(|d| number("device", d)).transpose()? })
    }
}

/// The copies of every resource that `needs` (one map per registered
/// instance) use: as given by `explicit` (`--rate-limit-resource`) or, when
/// it gives none, the most any instance needs.
///
/// # Errors
/// Triton's texts: an explicit count below what an instance needs
/// (`Resource count for "R" is limited to N which will prevent scheduling
/// of one or more model instances, the minimum required count is M`), and
/// a resource both global and per device.
pub fn available<'a>(explicit: &[ResourceCount], needs: impl Iterator<Item = &'a Needs>) -> Result<Needs, String> {
    let mut most = Needs::new();
    for instance in needs {
        for (key, &count) in instance {
            let entry = most.entry(key.clone()).or_default();
            *entry = (*entry).max(count);
        }
    }
    if !explicit.is_empty() {
        for ((scope, name), needed) in &mut most {
            let given = given(explicit, *scope, name);
            if given < *needed {
                return Err(format!(
                    "Resource count for \"{name}\" is limited to {given} which will prevent scheduling of one or \
                     more model instances, the minimum required count is {needed}"
                ));
            }
            *needed = given;
        }
    }
    for (scope, name) in most.keys() {
        let both = *scope == Scope::Global && most.keys().any(|(s, n)| n == name && *s != Scope::Global);
        if both {
            return Err(format!(
                "Resource \"{name}\" is present as both global and device-specific resource in the model \
                 configuration."
            ));
        }
    }
    Ok(most)
}

/// The copies `explicit` gives of `name` in `scope`: for a global resource
/// the most any flag gives it (its device ignored); on a device the most
/// given for that GPU or for every device; none when no flag names it.
fn given(explicit: &[ResourceCount], scope: Scope, name: &str) -> u32 {
    let applies = |flag: &&ResourceCount| match scope {
        Scope::Global => true,
        Scope::Device(Device::Gpu(gpu)) => flag.device.is_none_or(|d| d == gpu),
        Scope::Device(Device::Cpu) => flag.device.is_none(),
    };
    explicit.iter().filter(|f| f.name == name).filter(applies).map(|f| f.count).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(list: &[(Scope, &str, u32)]) -> Needs {
        list.iter().map(|&(s, n, c)| ((s, n.to_owned()), c)).collect()
    }

    const GPU0: Scope = Scope::Device(Device::Gpu(0));
    const GPU1: Scope = Scope::Device(Device::Gpu(1));

    #[test]
    fn the_copies_default_to_the_most_any_instance_needs() {
        // Triton's example: A [R1: 4, R2: 4], B [R2: 5, R3: 10, R4: 5], C [R1: 1, R3: 7, R4: 2].
        let a = needs(&[(GPU0, "r1", 4), (GPU0, "r2", 4)]);
        let b = needs(&[(GPU0, "r2", 5), (GPU0, "r3", 10), (GPU0, "r4", 5)]);
        let c = needs(&[(GPU0, "r1", 1), (GPU0, "r3", 7), (GPU0, "r4", 2)]);
        let got = available(&[], [&a, &b, &c].into_iter()).unwrap();
        assert_eq!(got, needs(&[(GPU0, "r1", 4), (GPU0, "r2", 5), (GPU0, "r3", 10), (GPU0, "r4", 5)]));
    }

    #[test]
    fn explicit_counts_apply_per_device_globally_and_must_cover_every_need() {
        let flags: Vec<ResourceCount> =
            ["r1:10", "r2:5:0", "r2:8:1", "r3:2"].iter().map(|f| f.parse().unwrap()).collect();
        let instance =
            needs(&[(GPU0, "r1", 1), (GPU1, "r1", 1), (GPU0, "r2", 1), (GPU1, "r2", 1), (Scope::Global, "r3", 1)]);
        let got = available(&flags, std::iter::once(&instance)).unwrap();
        assert_eq!(
            got,
            needs(&[(Scope::Global, "r3", 2), (GPU0, "r1", 10), (GPU0, "r2", 5), (GPU1, "r1", 10), (GPU1, "r2", 8)])
        );
        let short = needs(&[(Scope::Device(Device::Cpu), "resource1", 4)]);
        let flags = ["resource1:3".parse().unwrap()];
        assert_eq!(
            available(&flags, std::iter::once(&short)).unwrap_err(),
            "Resource count for \"resource1\" is limited to 3 which will prevent scheduling of one or more model \
             instances, the minimum required count is 4"
        );
        let elsewhere = ["resource1:10:10".parse().unwrap()];
        let e = available(&elsewhere, std::iter::once(&short)).unwrap_err();
        assert!(e.contains("is limited to 0 which"), "{e}");
        // Names match as written: `RESOURCE1` gives `resource1` nothing.
        let other_case = ["RESOURCE1:10".parse().unwrap()];
        let e = available(&other_case, std::iter::once(&short)).unwrap_err();
        assert!(e.contains("\"resource1\" is limited to 0 which"), "{e}");
    }

    #[test]
    fn a_resource_both_global_and_per_device_is_refused() {
        let a = needs(&[(Scope::Global, "resource2", 2)]);
        let b = needs(&[(Scope::Device(Device::Cpu), "resource2", 2)]);
        assert_eq!(
            available(&[], [&a, &b].into_iter()).unwrap_err(),
            "Resource \"resource2\" is present as both global and device-specific resource in the model configuration."
        );
    }

    #[test]
    fn the_flag_reads_triton_s_shapes_keeping_the_name_s_case() {
        assert_eq!(
            "GPU_Mem:4:1".parse::<ResourceCount>().unwrap(),
            ResourceCount { name: "GPU_Mem".into(), count: 4, device: Some(1) }
        );
        assert!(":1".parse::<ResourceCount>().unwrap_err().ends_with("the resource name is empty"));
        assert!("R:0".parse::<ResourceCount>().unwrap_err().ends_with("count must be 1 or more"));
        assert_eq!("r:2".parse::<ResourceCount>().unwrap().device, None);
        for bad in ["r", "r:1:2:3"] {
            let e = bad.parse::<ResourceCount>().unwrap_err();
            assert!(e.starts_with("--rate-limit-resource option format is '<resource_name>:<count>:<device>'"), "{e}");
        }
        assert!("r:x".parse::<ResourceCount>().unwrap_err().contains("count 'x' is not a whole number"));
    }
}
