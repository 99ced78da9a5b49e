#!/usr/bin/env bash
# Builds Plinth's container image from the bundle scripts/dist.sh writes, as an
# OCI image layout folder (no container engine, no daemon, no root needed):
#
#   /opt/plinth/            the bundle as it is (bin/plinth, lib/, share/, LICENSES/)
#   /usr/lib/..., /lib64/   exactly the system libraries the bundle links (glibc,
#                           libstdc++, libgcc_s, ...: `ldd` of bin/plinth and lib/*.so),
#                           copied from this machine, whose glibc the bundle was built against
#   /usr/share/doc/PKG/     those libraries' Debian copyright files (their licences)
#   /var/lib/dpkg/status.d/ and /etc/os-release: which Debian packages the
#                           libraries come from, for image scanners (as distroless images do)
#   /etc/ssl/certs/         Debian's CA certificates, which the server's TLS clients
#                           (object storage over HTTPS, the OTLP exporter) verify servers by
#   /etc/passwd, /etc/group the user plinth, 10001:10001, home /home/plinth (its own)
#   /tmp, /models           scratch space, and where the model repository is mounted
#   /proc, /sys, /dev       empty mount points
# Nothing else: no shell, no package manager. The configuration: entrypoint
# `/opt/plinth/bin/plinth serve`, command `--model-repository /models`, user
# 10001:10001, ports 8000 (HTTP), 8001 (gRPC), 8002 (metrics).
#
# Usage: scripts/image.sh [BUNDLE] [OUT]   (defaults: dist/plinth, dist/image)
#   IMAGE=NAME:TAG  the image's name (default plinth:VERSION); OUT holds it under TAG
# Needs umoci (Debian package `umoci`); skopeo pushes the result.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-dist/plinth}
out=${2:-dist/image}

command -v umoci >/dev/null \
    || { echo "umoci is missing: apt-get install umoci (or run \`scripts/setup.sh test\`)" >&2; exit 1; }
[[ -x $bundle/bin/plinth && -d $bundle/lib ]] \
    || { echo "$bundle is not a bundle (no bin/plinth, lib/): run \`scripts/dist.sh $bundle\` first" >&2; exit 1; }
bundle=$(realpath "$bundle")

# The version of the binary going into the image; the workspace's when it
# cannot say (its output is "plinth 0.1.0").
version=$("$bundle/bin/plinth" --version 2>/dev/null | awk '$1 == "plinth" {print $2; exit}') || true
[[ $version =~ ^[0-9]+\.[0-9]+ ]] || version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image=${IMAGE:-plinth:$version}
# NAME:TAG, where NAME may hold a registry's host:port: the tag is what
# follows the last colon unless a slash follows it too.
tag=${image##*:}
if [[ $tag == "$image" || $tag == */* ]]; then tag=latest name=$image; else name=${image%:*}; fi
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || { echo "'$tag' is not a valid image tag" >&2; exit 1; }
echo "== image $name:$tag from $bundle"

# The root filesystem is staged beside OUT (same disk, not /tmp) and removed
# at the end, whatever happens.
mkdir -p "$(dirname "$out")"
stage=$(mktemp -d "$(dirname "$out")/.image-stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/rootfs
mkdir -p "$root"

echo "-- root filesystem: the bundle in /opt/plinth"
mkdir -p "$root/opt"
cp -r --preserve=mode,timestamps "$bundle" "$root/opt/plinth"

# Debian 12's merged /usr: /lib and /lib64 are links into /usr, as on the
# host, so every path the binaries name (the ELF interpreter
# /lib64/ld-linux-x86-64.so.2, the default search path) resolves.
mkdir -p "$root/usr/lib/x86_64-linux-gnu" "$root/usr/lib64"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"

# Copies host path $1 into the root filesystem at the same path: its
# directory resolved (the host's and the image's layouts agree), each symbolic
# link on the way recreated as a link, the last target as a file.
copy_host_path() {
    local path=$1 dir target
    while :; do
        dir=$(realpath "$(dirname "$path")")
        path=$dir/$(basename "$path")
        mkdir -p "$root$dir"
        if [[ -L $path ]]; then
            target=$(readlink "$path")
            ln -sfn "$target" "$root$path"
            [[ $target == /* ]] || target=$dir/$target
            path=$target
        else
            cp --preserve=mode,timestamps "$path" "$root$path"
            return
        fi
    done
}

# What the bundle loads from the system: ldd of the binary and of every
# library in lib/ (ONNX Runtime is opened at run time, so the binary's own
# list does not show it), with lib/ on the search path so that the bundle's
# own libraries are found there and left out.
echo "-- root filesystem: the system libraries the bundle links (ldd)"
declare -A libraries=() missing=()
for file in "$bundle/bin/plinth" "$bundle"/lib/*.so*; do
    [[ -f $file && ! -L $file ]] || continue
    while read -r first arrow resolved _; do
        if [[ $arrow == "=>" && $resolved == /* ]]; then
            libraries[$resolved]=1
        elif [[ $arrow == "=>" && $resolved == not ]]; then
            missing[$first]+=" ${file#"$bundle"/}"
        elif [[ $first == /* ]]; then
            libraries[$first]=1   # the ELF interpreter
        fi
    done < <(LD_LIBRARY_PATH=$bundle/lib ldd "$file" 2>/dev/null || true)
done
# A library that neither the system nor the bundle has: the binary itself
# must find all of its own, but a bundled library may name one it only uses
# on a path the bundle never takes (libtorch's CUDA part, say).
for soname in "${!missing[@]}"; do
    [[ -e $bundle/lib/$soname ]] && continue
    if [[ ${missing[$soname]} == *bin/plinth* ]]; then
        echo "bin/plinth needs $soname, which neither the system nor the bundle has" >&2
        exit 1
    fi
    echo "   note: $soname (named by${missing[$soname]}) is not on this system nor in the bundle; not copied"
done
declare -A packages=()
for lib in $(printf '%s\n' "${!libraries[@]}" | sort); do
    [[ $(realpath "$lib") == "$bundle"/* ]] && continue
    copy_host_path "$lib"
    # dpkg knows a file by the path its package ships (/lib/... or /usr/lib/...).
    package=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(realpath "$lib")" 2>/dev/null || true)
    package=${package%%:*}
    echo "   $lib${package:+ ($package)}"
    if [[ -n $package ]]; then packages[$package]=1; fi
done

echo "-- root filesystem: the CA certificates"
bundle_of_roots=/etc/ssl/certs/ca-certificates.crt
[[ -f $bundle_of_roots ]] \
    || { echo "$bundle_of_roots is missing: apt-get install ca-certificates (or run \`scripts/setup.sh test\`)" >&2; exit 1; }
mkdir -p "$root/etc/ssl/certs"
cp "$bundle_of_roots" "$root/etc/ssl/certs/ca-certificates.crt"
packages[ca-certificates]=1

echo "-- root filesystem: licences and package records of ${!packages[*]}"
mkdir -p "$root/var/lib/dpkg/status.d"
for package in "${!packages[@]}"; do
    if [[ -f /usr/share/doc/$package/copyright ]]; then
        mkdir -p "$root/usr/share/doc/$package"
        cp /usr/share/doc/"$package"/copyright "$root/usr/share/doc/$package/copyright"
    else
        echo "   note: /usr/share/doc/$package/copyright is missing on this system" >&2
    fi
    dpkg-query -s "$package" > "$root/var/lib/dpkg/status.d/$package"
done
mkdir -p "$root/etc"
cp -L /etc/os-release "$root/etc/os-release"

echo "-- root filesystem: user plinth (10001), /tmp, /models, mount points"
cat > "$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
plinth:x:10001:10001:Plinth:/home/plinth:/sbin/nologin
EOF
cat > "$root/etc/group" <<'EOF'
root:x:0:
plinth:x:10001:
EOF
# /etc/hosts before DNS, as glibc's default order would not have it.
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$root/etc/nsswitch.conf"
mkdir -p "$root/tmp" "$root/models" "$root/root" "$root/home"
chmod 1777 "$root/tmp"
# Mount points, which container engines create anyway; with them the
# unpacked root filesystem also runs under plain chroot or unshare, given
# /proc: the binary's run path $ORIGIN/../lib is found through /proc/self/exe.
mkdir -p "$root/proc" "$root/sys" "$root/dev"
chmod 0700 "$root/root"
# The home folder is plinth's own: compiled plugins are cached in ~/.cache.
mkdir -p "$stage/home/home/plinth"
chmod 0755 "$stage/home/home/plinth"

# The layer: one tar, every file owned by root except the home folder,
# whatever user builds it (so that building needs no root).
echo "-- layer: tar of the root filesystem ($(du -sh "$root" | cut -f1))"
layer=$stage/layer.tar
(cd "$root" && tar --create --file "$layer" --sort=name --format=posix --numeric-owner --owner=0 --group=0 \
    --pax-option=delete=atime,delete=ctime -- *)
tar --append --file "$layer" --directory "$stage/home" --format=posix --numeric-owner --owner=10001 --group=10001 \
    --no-recursion home/plinth

echo "-- OCI layout $out: umoci init, raw add-layer (gzip), config"
rm -rf "$out"
umoci init --layout "$out"
umoci new --image "$out:$tag"
umoci raw add-layer --image "$out:$tag" --history.created_by "scripts/image.sh (the bundle of plinth $version)" "$layer"
# The OCI image format has no health check (Docker's HEALTHCHECK belongs to
# its own format): Kubernetes uses the probes in deploy/, and Docker takes
# `--health-cmd '/opt/plinth/bin/plinth health'`.
umoci config --image "$out:$tag" --no-history \
    --config.entrypoint /opt/plinth/bin/plinth --config.entrypoint serve \
    --config.cmd --model-repository --config.cmd /models \
    --config.user 10001:10001 --config.workingdir / \
    --config.env PATH=/opt/plinth/bin --config.env HOME=/home/plinth \
    --config.exposedports 8000/tcp --config.exposedports 8001/tcp --config.exposedports 8002/tcp \
    --config.stopsignal SIGTERM \
    --config.label org.opencontainers.image.title=plinth \
    --config.label org.opencontainers.image.version="$version" \
    --config.label org.opencontainers.image.licenses=Apache-2.0 \
    --manifest.annotation org.opencontainers.image.version="$version"
umoci gc --layout "$out"

unpacked=$(du -sh "$root" | cut -f1)
compressed=$(du -sh "$out" | cut -f1)
registry_name=$name
[[ $name == */* ]] || registry_name=REGISTRY/$name
echo "== image $name:$tag in $out (OCI layout, tag $tag): $compressed compressed, $unpacked unpacked"
echo "   push it:         skopeo copy oci:$out:$tag docker://$registry_name:$tag"
echo "   into Docker:     skopeo copy oci:$out:$tag docker-daemon:$name:$tag"
echo "   run it:          docker run -p 8000:8000 -v \$PWD/model_repository:/models:ro $name:$tag"
echo "                    (or podman run ... oci:$out:$tag)"
