use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::policy::{Policy, RequestOptions};
use super::*;
use crate::backend::fake::{Doubler, Gate};
use crate::metrics::Metrics;

/// The longest a test waits for an event that must come.
const HANG_GUARD: Duration = Duration::from_secs(30);

struct Fixture {
    scheduler: Arc<Scheduler>,
    backend: Arc<Doubler>,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
}

/// A scheduler over one gated doubler, with the scheduling part of a
/// `config.pbtxt`.
fn fixture(config: &str) -> Fixture {
    let config = crate::config::parse(&format!("max_batch_size: 8 {config}")).unwrap();
    let gate = Gate::closed();
    let backend = Arc::new(Doubler::gated(Some(gate.clone())));
    let metrics = Arc::new(Metrics::new());
    let instances: Vec<Arc<dyn Backend>> = vec![backend.clone()];
    let policy = Policy::from_config(&config).unwrap();
    let scheduler = Arc::new(Scheduler::start("m", policy, instances, metrics.for_model("m", 1), None));
    Fixture { scheduler, backend, gate, metrics }
}

impl Fixture {
    fn submit(&self, values: &[f32]) -> tokio::task::JoinHandle<Result<Vec<f32>, Error>> {
        let scheduler = self.scheduler.clone();
        let inputs = Doubler::input(values);
        tokio::spawn(async move {
            let (outputs, _) = scheduler.submit(inputs, RequestOptions::default()).await?;
            Ok(Doubler::values(&outputs[0]))
        })
    }

    /// Waits until `n` requests are queued (the pending gauge).
    fn wait_for_queued(&self, n: i64) {
        let pending = self.metrics.for_model("m", 1);
        let deadline = Instant::now() + HANG_GUARD;
        while pending.pending().get() != n {
            assert!(Instant::now() < deadline, "{} queued, not {n}", pending.pending().get());
            std::thread::yield_now();
        }
    }

    /// Waits until no thread holds the instance.
    fn wait_for_idle_instance(&self) {
        let deadline = Instant::now() + HANG_GUARD;
        while self.scheduler.shared.slots[0].running.try_lock().is_none() {
            assert!(Instant::now() < deadline, "the instance stayed busy");
            std::thread::yield_now();
        }
    }

    fn executions(&self) -> Vec<usize> {
        self.backend.executions.lock().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queued_while_the_instance_is_busy_run_as_one_batch() {
    let f = fixture("dynamic_batching { }");
    let first = f.submit(&[1.0]);
    f.gate.wait_for_waiters(1);
    let rest: Vec<_> = [[2.0, 3.0].as_slice(), &[4.0], &[5.0]].iter().map(|v| f.submit(v)).collect();
    f.wait_for_queued(3);
    f.gate.open();
    assert_eq!(first.await.unwrap().unwrap(), [2.0]);
    let answers: Vec<Vec<f32>> = futures_join(rest).await;
    assert_eq!(answers, [vec![4.0, 6.0], vec![8.0], vec![10.0]], "each gets exactly its own rows");
    assert_eq!(f.executions(), [1, 4], "the three queued requests ran as one batch of four rows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_with_overloaded() {
    let f = fixture("dynamic_batching { default_queue_policy { max_queue_size: 1 } }");
    let running = f.submit(&[1.0]);
    f.gate.wait_for_waiters(1);
    let queued = f.submit(&[2.0]);
    f.wait_for_queued(1);
    let refused = f.submit(&[3.0]).await.unwrap().unwrap_err();
    assert!(
        matches!(&refused, Error::Overloaded(o) if o.message.contains("queue at priority level 1 is full (1 requests")),
        "{refused:?}"
    );
    f.gate.open();
    assert_eq!(running.await.unwrap().unwrap(), [2.0]);
    assert_eq!(queued.await.unwrap().unwrap(), [4.0]);
    assert_eq!(f.executions(), [1, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_backend_refuses_fails_alone_not_its_batch() {
    let f = fixture("dynamic_batching { }");
    let first = f.submit(&[1.0]);
    f.gate.wait_for_waiters(1);
    let batch: Vec<_> = [[1.0], [-1.0], [3.0]].iter().map(|v| f.submit(v)).collect();
    f.wait_for_queued(3);
    f.gate.open();
    first.await.unwrap().unwrap();
    let mut answers = Vec::new();
    for handle in batch {
        answers.push(handle.await.unwrap());
    }
    assert_eq!(answers[0], Ok(vec![2.0]));
    assert!(matches!(&answers[1], Err(Error::InvalidArgument(m)) if m.contains("model 'm': -1 is not")), "{answers:?}");
    assert_eq!(answers[2], Ok(vec![6.0]));
    assert_eq!(f.executions(), [1, 3, 1, 1, 1], "the batch was refused, then each request ran alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_went_away_never_runs_and_counts_as_canceled() {
    let f = fixture("");
    let running = f.submit(&[1.0]);
    f.gate.wait_for_waiters(1);
    let abandoned = f.submit(&[2.0]);
    f.wait_for_queued(1);
    abandoned.abort();
    f.wait_for_queued(0);
    f.gate.open();
    running.await.unwrap().unwrap();
    assert_eq!(f.executions(), [1], "the abandoned request never ran");
    let text = f.metrics.render();
    assert!(text.contains(r#"nv_inference_request_failure{model="m",reason="CANCELED",version="1"} 1"#), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_requests_run_first() {
    let f = fixture("dynamic_batching { priority_levels: 2 default_priority_level: 2 }");
    let first = f.submit(&[1.0]);
    f.gate.wait_for_waiters(1);
    // Six and four rows cannot share a batch of eight.
    let low = f.submit(&[2.0; 4]);
    f.wait_for_queued(1);
    let scheduler = f.scheduler.clone();
    let high = tokio::spawn(async move {
        scheduler
            .submit(Doubler::input(&[3.0; 6]), RequestOptions { priority: Some(1), ..RequestOptions::default() })
            .await
    });
    f.wait_for_queued(2);
    f.gate.open();
    first.await.unwrap().unwrap();
    high.await.unwrap().unwrap();
    low.await.unwrap().unwrap();
    assert_eq!(f.executions(), [1, 6, 4], "the later, higher-priority request ran before the earlier one");
}

async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<Result<T, Error>>>) -> Vec<T> {
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_model_s_lone_request_runs_on_its_own_thread() {
    let f = fixture("");
    f.gate.open();
    // The measured mean is set, not measured: a shared machine can take
    // longer than INLINE_INFER over the doubler's first run.
    // The worker answers before it lets go of the instance, so each
    // request waits for the instance to be idle.
    let measured = |mean: Duration| {
        f.scheduler.shared.infer_us.store(mean.as_micros() as u64, Ordering::Relaxed);
        f.wait_for_idle_instance();
    };
    assert_eq!(f.submit(&[1.0]).await.unwrap().unwrap(), [2.0], "an unmeasured model runs on its worker");
    measured(INLINE_INFER);
    assert_eq!(f.submit(&[2.0]).await.unwrap().unwrap(), [4.0]);
    measured(INLINE_INFER + Duration::from_micros(1));
    assert_eq!(f.submit(&[3.0]).await.unwrap().unwrap(), [6.0]);
    let threads = f.backend.threads.lock().clone();
    assert_eq!(threads[0].as_deref(), Some("plinth-m-0"));
    assert_ne!(threads[1].as_deref(), Some("plinth-m-0"), "a model measured fast runs inline");
    assert_eq!(threads[2].as_deref(), Some("plinth-m-0"), "a model measured slower runs on its worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_waits_to_batch_never_runs_inline() {
    let f = fixture("dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100 }");
    f.gate.open();
    for x in [1.0, 2.0, 3.0] {
        assert_eq!(f.submit(&[x]).await.unwrap().unwrap(), [2.0 * x]);
    }
    let threads = f.backend.threads.lock().clone();
    assert!(threads.iter().all(|t| t.as_deref() == Some("plinth-m-0")), "{threads:?}");
}
