use std::time::{Duration, Instant};

use super::*;

fn plan(json: &str) -> Plan {
    Plan::parse(json.as_bytes()).unwrap()
}

const FAST: Duration = Duration::from_millis(1);

#[test]
fn a_split_by_count_gives_the_candidate_its_exact_share() {
    let mut rollout = Rollout::new(plan(r#"{"candidate": 2, "steps": [10, 100]}"#), 1, Instant::now());
    let to_candidate = (0..1000).filter(|_| rollout.route(None) == 2).count();
    assert_eq!(to_candidate, 100);
}

#[test]
fn a_sticky_key_meets_one_version_and_stays_with_the_candidate_as_its_share_grows() {
    let mut rollout =
        Rollout::new(plan(r#"{"candidate": 2, "steps": [10, 50, 100], "sticky_header": "x-user"}"#), 1, Instant::now());
    let keys: Vec<String> = (0..2000).map(|i| format!("user-{i}")).collect();
    let first: Vec<u64> = keys.iter().map(|k| rollout.route(Some(k))).collect();
    assert_eq!(first, keys.iter().map(|k| rollout.route(Some(k))).collect::<Vec<_>>(), "one key, one version");
    let share = first.iter().filter(|v| **v == 2).count();
    assert!((100..300).contains(&share), "about 10 % of keys: {share}");
    rollout.step = 1;
    for (key, before) in keys.iter().zip(&first) {
        if *before == 2 {
            assert_eq!(rollout.route(Some(key)), 2, "{key} stays on the candidate");
        }
    }
}

#[test]
fn failures_past_the_rate_roll_back_at_once() {
    let now = Instant::now();
    let mut rollout = Rollout::new(
        plan(r#"{"candidate": 2, "steps": [10, 100], "min_requests": 20, "max_error_rate": 0.05}"#),
        1,
        now,
    );
    // One failure in 20 is within 5 %; the second is not.
    assert_eq!(rollout.observe(2, FAST, true, now), None);
    let Some(Transition::RolledBack { candidate: 2, reason }) = rollout.observe(2, FAST, true, now) else {
        panic!("rolled back")
    };
    assert!(reason.starts_with("error rate: 2 of 2 requests failed on version 2"), "{reason}");
    assert_eq!(rollout.route(None), 1, "every request back on version 1");
    assert_eq!(rollout.observe(2, FAST, true, now), None, "a finished rollout judges nothing");
}

#[test]
fn a_slow_candidate_is_rolled_back_on_p99_once_both_sides_are_measured() {
    let now = Instant::now();
    let mut rollout = Rollout::new(plan(r#"{"candidate": 2, "min_requests": 10, "max_p99_ratio": 1.5}"#), 1, now);
    // Three times as slow, but within the slack: noise, not a regression.
    let mut fast = Rollout::new(plan(r#"{"candidate": 2, "min_requests": 10, "p99_slack_ms": 1}"#), 1, now);
    for _ in 0..10 {
        fast.observe(1, Duration::from_micros(100), false, now);
    }
    for _ in 0..10 {
        assert_eq!(fast.observe(2, Duration::from_micros(300), false, now), None);
    }
    for _ in 0..10 {
        assert_eq!(rollout.observe(1, Duration::from_millis(10), false, now), None);
    }
    for _ in 0..9 {
        assert_eq!(rollout.observe(2, Duration::from_millis(30), false, now), None);
    }
    let Some(Transition::RolledBack { reason, .. }) = rollout.observe(2, Duration::from_millis(30), false, now) else {
        panic!("rolled back")
    };
    assert!(reason.starts_with("p99 latency: version 2 took"), "{reason}");
}

#[test]
fn a_good_candidate_goes_through_every_step_after_its_dwell_and_is_promoted() {
    let start = Instant::now();
    let mut rollout =
        Rollout::new(plan(r#"{"candidate": 2, "steps": [10, 50, 100], "dwell_secs": 5, "min_requests": 3}"#), 1, start);
    let feed = |rollout: &mut Rollout, at: Instant| {
        let mut last = None;
        for version in [1, 2, 1, 2, 1, 2] {
            last = rollout.observe(version, FAST, false, at).or(last);
        }
        last
    };
    assert_eq!(feed(&mut rollout, start), None, "the dwell time has not passed");
    let later = start + Duration::from_secs(5);
    assert_eq!(feed(&mut rollout, later), Some(Transition::Advanced { step: 2, percent: 50.0 }));
    let later = later + Duration::from_secs(5);
    assert_eq!(feed(&mut rollout, later), Some(Transition::Advanced { step: 3, percent: 100.0 }));
    // At 100 % only the candidate answers; the serving side keeps the
    // previous step's figures for the latency rule.
    let later = later + Duration::from_secs(5);
    let mut promoted = None;
    for _ in 0..3 {
        promoted = rollout.observe(2, FAST, false, later).or(promoted);
    }
    assert_eq!(promoted, Some(Transition::Promoted { candidate: 2, serving: 1 }));
    assert_eq!(rollout.route(None), 2);
}

#[test]
fn answers_that_differ_in_the_shadow_phase_roll_back_before_any_live_traffic() {
    let now = Instant::now();
    let mut rollout = Rollout::new(
        plan(r#"{"candidate": 2, "min_requests": 10, "shadow": {"requests": 20, "max_disagreement_rate": 0.1}}"#),
        1,
        now,
    );
    assert_eq!(rollout.phase, Phase::Shadow);
    assert_eq!(rollout.route(None), 1, "the candidate answers nobody");
    for _ in 0..9 {
        rollout.shadow_ticket("m").unwrap();
        assert_eq!(rollout.shadowed(Ok(()), now), None);
    }
    rollout.shadow_ticket("m").unwrap();
    assert_eq!(rollout.shadowed(Err("output 'Y' element 0: 5 against 4".into()), now), None, "1 in 10 is allowed");
    rollout.shadow_ticket("m").unwrap();
    let Some(Transition::RolledBack { reason, .. }) = rollout.shadowed(Err("output 'Y' element 0: 6".into()), now)
    else {
        panic!("rolled back")
    };
    assert!(reason.starts_with("answers: 2 of 11 shadowed requests differed on version 2"), "{reason}");
    assert!(reason.ends_with("first: output 'Y' element 0: 5 against 4"), "{reason}");
    assert_eq!(rollout.candidate_window.requests, 0);
}

#[test]
fn agreeing_answers_end_the_shadow_phase_and_a_full_queue_drops_requests() {
    let now = Instant::now();
    let mut rollout = Rollout::new(
        plan(r#"{"candidate": 2, "steps": [10, 100], "shadow": {"requests": 3, "queue": 2, "percent": 50}}"#),
        1,
        now,
    );
    // Every other request is chosen; two may be in flight at once.
    let chosen: Vec<bool> = (0..6).map(|_| rollout.shadow_ticket("m").is_some()).collect();
    assert_eq!(chosen, [false, true, false, true, false, false]);
    assert_eq!(rollout.shadow.dropped, 1);
    assert_eq!(rollout.shadowed(Ok(()), now), None);
    assert_eq!(rollout.shadowed(Ok(()), now), None);
    rollout.shadow_ticket("m");
    rollout.shadow_ticket("m").unwrap();
    assert_eq!(rollout.shadowed(Ok(()), now), Some(Transition::Advanced { step: 1, percent: 10.0 }));
    assert_eq!(rollout.phase, Phase::Canary);
    assert_eq!(rollout.shadow_ticket("m").map(|t| t.candidate), None, "no shadowing in the canary");
}

#[test]
fn a_plan_whose_only_step_is_100_promotes_on_the_candidates_evidence() {
    let now = Instant::now();
    let mut rollout =
        Rollout::new(plan(r#"{"candidate": 2, "steps": [100], "dwell_secs": 0, "min_requests": 5}"#), 1, now);
    let answers: Vec<_> = (0..5).map(|_| rollout.observe(2, FAST, false, now)).collect();
    assert_eq!(answers[..4], [None, None, None, None]);
    assert_eq!(answers[4], Some(Transition::Promoted { candidate: 2, serving: 1 }));
}

#[test]
fn a_sequence_id_keys_a_request_whatever_the_plan_s_sticky_header() {
    let rollouts = Rollouts::new(crate::metrics::Metrics::new().rollout.clone());
    rollouts.start("m", plan(r#"{"candidate": 2, "steps": [50, 100]}"#), 1);
    let first: Vec<u64> = (0..200).map(|id| rollouts.route_by_key("m", &id.to_string()).unwrap()).collect();
    let again: Vec<u64> = (0..200).map(|id| rollouts.route_by_key("m", &id.to_string()).unwrap()).collect();
    assert_eq!(first, again, "one sequence, one version");
    let share = first.iter().filter(|v| **v == 2).count();
    assert!((60..140).contains(&share), "about half the sequences meet version 2: {share}");
}
