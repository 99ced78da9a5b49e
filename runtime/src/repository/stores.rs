//! The `object_store` client of each provider, with credentials from that
//! provider's standard chain as Triton documents it
//! (`docs/user_guide/model_repository.md`, "Cloud Storage"):
//!
//! - S3: the AWS environment variables (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION`,
//!   `AWS_ENDPOINT_URL_S3`, web identity with `AWS_WEB_IDENTITY_TOKEN_FILE`
//!   and `AWS_ROLE_ARN`, ECS container credentials), then the shared
//!   credentials and config files of `aws configure` (`AWS_PROFILE`,
//!   default `default`), then the instance metadata service. Environment
//!   variables win over the files, as in Triton.
//! - GCS: `GOOGLE_APPLICATION_CREDENTIALS` (or a service account file or
//!   key), then the attached service account; `STORAGE_EMULATOR_HOST`
//!   points at an emulator, unauthenticated.
//! - Azure: `AZURE_STORAGE_KEY` (Triton's name) or `AZURE_STORAGE_ACCOUNT_KEY`
//!   for shared-key access, else a service principal
//!   (`AZURE_STORAGE_CLIENT_ID`/`_SECRET`/`AZURE_STORAGE_TENANT_ID`) or the
//!   managed identity; `AZURE_STORAGE_USE_EMULATOR=true` (with
//!   `AZURITE_BLOB_STORAGE_URL`) points at Azurite.
//!
//! Credentials are read by the client when a request needs them and never
//! logged or put in a message.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::RetryConfig;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;

use super::listing::Client;
use super::location::Store;

/// The client of `store`.
///
/// # Errors
/// The client's message when it cannot be set up (an endpoint that is not
/// a URL, a credentials file that does not parse).
pub fn connect(store: &Store, retries: RetryConfig) -> Result<Arc<dyn Client>, String> {
    // reqwest's TLS needs a process-wide crypto provider; a second call
    // finds it installed. ring's provider is deprecated only for lacking
    // post-quantum key exchange; aws-lc-rs would add a C build of its own.
    #[allow(deprecated)]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let built: Result<Arc<dyn Client>, object_store::Error> = match store {
        Store::S3 { bucket, endpoint } => s3(bucket, endpoint.as_deref(), retries).build().map(|s| Arc::new(s) as _),
        Store::Gcs { bucket } => gcs(bucket, retries).build().map(|s| Arc::new(s) as _),
        Store::Azure { account, container } => azure(account, container, retries).build().map(|s| Arc::new(s) as _),
    };
    built.map_err(|e| e.to_string())
}

fn s3(bucket: &str, endpoint: Option<&str>, retries: RetryConfig) -> AmazonS3Builder {
    // The environment first; the shared files fill in what it leaves out.
    let mut builder = AmazonS3Builder::from_env();
    if let Some(profile) = SharedProfile::read() {
        builder = profile.fill(builder);
    }
    let mut builder = builder.with_bucket_name(bucket).with_retry(retries);
    if let Some(endpoint) = endpoint {
        // A private S3 (MinIO, Ceph, moto): path-style requests, HTTP when
        // the location says so, and a region the server ignores.
        builder = builder
            .with_endpoint(endpoint)
            .with_allow_http(endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
        if builder.get_config_value(&AmazonS3ConfigKey::Region).is_none() {
            builder = builder.with_region("us-east-1");
        }
    }
    builder
}

fn gcs(bucket: &str, retries: RetryConfig) -> GoogleCloudStorageBuilder {
    let mut builder = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket).with_retry(retries);
    if let Ok(path) = std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
        builder = builder.with_application_credentials(path);
    }
    if let Ok(host) = std::env::var("STORAGE_EMULATOR_HOST") {
        let url = if host.contains("://") { host } else { format!("http://{host}") };
        builder = builder
            .with_base_url(&url)
            .with_skip_signature(true)
            .with_client_options(object_store::ClientOptions::new().with_allow_http(true));
    }
    builder
}

fn azure(account: &str, container: &str, retries: RetryConfig) -> MicrosoftAzureBuilder {
    let mut builder =
        MicrosoftAzureBuilder::from_env().with_account(account).with_container_name(container).with_retry(retries);
    if let Ok(key) = std::env::var("AZURE_STORAGE_KEY") {
        builder = builder.with_access_key(key);
    }
    builder
}

/// The static credentials and region of a profile of the shared AWS files
/// (`~/.aws/credentials` and `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE`
/// and `AWS_CONFIG_FILE`), as `aws configure` writes them.
#[derive(Debug, Default, PartialEq, Eq)]
struct SharedProfile {
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
    session_token: Option<String>,
    region: Option<String>,
}

impl SharedProfile {
    /// The profile `AWS_PROFILE` names (default `default`), if the files
    /// have it.
    fn read() -> Option<SharedProfile> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let file = |variable: &str, default: &str| {
            std::env::var_os(variable).map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(default)))
        };
        let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
        let credentials = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials")
            .and_then(|path| ini::Ini::load_from_file(path).ok());
        let config = file("AWS_CONFIG_FILE", ".aws/config").and_then(|path| ini::Ini::load_from_file(path).ok());
        SharedProfile::of(&profile, credentials.as_ref(), config.as_ref())
    }

    /// The profile `name` in the two files: the credentials file's section
    /// `[name]`, the config file's `[profile name]` (`[default]` for the
    /// default profile).
    fn of(name: &str, credentials: Option<&ini::Ini>, config: Option<&ini::Ini>) -> Option<SharedProfile> {
        let config_section = if name == "default" { name.to_owned() } else { format!("profile {name}") };
        let get = |key: &str| {
            let in_credentials = credentials.and_then(|c| c.get_from(Some(name), key));
            let in_config = config.and_then(|c| c.get_from(Some(config_section.as_str()), key));
            in_credentials.or(in_config).map(str::to_owned)
        };
        let profile = SharedProfile {
            access_key_id: get("aws_access_key_id"),
            secret_access_key: get("aws_secret_access_key"),
            session_token: get("aws_session_token"),
            region: get("region"),
        };
        (profile != SharedProfile::default()).then_some(profile)
    }

    /// `builder` with the profile's values where it has none: keys only
    /// when the environment gives none (a key and a secret from two places
    /// would not pair), the region when it gives none.
    fn fill(self, mut builder: AmazonS3Builder) -> AmazonS3Builder {
        let unset = |builder: &AmazonS3Builder, key| builder.get_config_value(&key).is_none();
        if unset(&builder, AmazonS3ConfigKey::AccessKeyId)
            && let (Some(id), Some(secret)) = (self.access_key_id, self.secret_access_key)
        {
            builder = builder.with_access_key_id(id).with_secret_access_key(secret);
            if let Some(token) = self.session_token {
                builder = builder.with_token(token);
            }
        }
        if unset(&builder, AmazonS3ConfigKey::Region)
            && let Some(region) = self.region
        {
            builder = builder.with_region(region);
        }
        builder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_takes_its_keys_from_the_credentials_and_its_region_from_the_config() {
        let credentials = ini::Ini::load_from_str(
            "[default]\naws_access_key_id = A\naws_secret_access_key = S\n[dev]\naws_access_key_id = D\naws_secret_access_key = DS\naws_session_token = T\n",
        )
        .unwrap();
        let config =
            ini::Ini::load_from_str("[default]\nregion = eu-west-1\n[profile dev]\nregion = us-west-2\n").unwrap();
        let default = SharedProfile::of("default", Some(&credentials), Some(&config)).unwrap();
        assert_eq!(default.access_key_id.as_deref(), Some("A"));
        assert_eq!(default.region.as_deref(), Some("eu-west-1"));
        let dev = SharedProfile::of("dev", Some(&credentials), Some(&config)).unwrap();
        assert_eq!((dev.session_token.as_deref(), dev.region.as_deref()), (Some("T"), Some("us-west-2")));
        assert_eq!(SharedProfile::of("none", Some(&credentials), Some(&config)), None);
    }
}
