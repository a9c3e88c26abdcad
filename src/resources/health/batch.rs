//! Batch (gitops-engine health_job.go; argo-cd resource_customizations/batch/CronJob/health.lua).

use super::fields::*;
use super::Health;
use super::HealthStatus::*;
use crate::resources::tree::Tree;

pub(super) fn job(obj: &Obj) -> Health {
    // Kubernetes only ever sets these conditions True; an explicit False is not taken as set.
    let is_set = |c: Option<&Tree>| c.is_some() && !cond_status_is(c, "False");
    let failed = condition(obj, "Failed");
    if is_set(failed) {
        return Health::new(Degraded, cond_message(failed));
    }
    let complete = condition(obj, "Complete");
    if is_set(complete) {
        return Health::new(Healthy, cond_message(complete));
    }
    let suspended = condition(obj, "Suspended");
    if cond_status_is(suspended, "True") || bool_at(obj, &["spec", "suspend"]) {
        let message = match cond_message(suspended) {
            "" => "Job is suspended",
            m => m,
        };
        return Health::new(Suspended, message);
    }
    Health::new(Progressing, "Waiting for Job to complete")
}

pub(super) fn cron_job(obj: &Obj) -> Health {
    if bool_at(obj, &["spec", "suspend"]) {
        return Health::new(Suspended, "CronJob is Suspended");
    }
    let Some(status) = obj.status.filter(|s| s.is_object()) else {
        return Health::new(Progressing, "Waiting for CronJob");
    };
    // Progressing this often (on every run) bubbles up; Argo accepts that, and so do we.
    let active = list_at(status, &["active"]).len();
    if active > 0 {
        return Health::new(
            Progressing,
            format!("Waiting for {active} Jobs to complete"),
        );
    }
    // No Job running: the last run failed if it never succeeded since it was scheduled.
    // RFC 3339 UTC timestamps compare correctly as text, as Argo's Lua relies on.
    let Some(scheduled) = str_at(status, &["lastScheduleTime"]) else {
        return Health::new(Healthy, "");
    };
    match str_at(status, &["lastSuccessfulTime"]) {
        Some(succeeded) if succeeded >= scheduled => Health::new(
            Healthy,
            "CronJob has completed its last execution successfully",
        ),
        _ => Health::new(
            Degraded,
            "CronJob has not completed its last execution successfully",
        ),
    }
}

// ---------------------------------------------------------------------------------------------

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{json, Value};

    use super::super::testing::*;

    use super::super::HealthStatus::*;

    // --- Job and CronJob -------------------------------------------------------------------

    #[test]
    fn job_complete_is_healthy() {
        let o = job_with(
            json!({}),
            json!([{"type": "Complete", "status": "True", "message": "done"}]),
        );
        check(&o, Healthy, Some("done"));
    }

    #[test]
    fn job_failed_is_degraded() {
        let o = job_with(
            json!({}),
            json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit"}]),
        );
        check(
            &o,
            Degraded,
            Some("Job has reached the specified backoff limit"),
        );
    }

    #[test]
    fn job_suspended() {
        let by_condition = job_with(
            json!({"suspend": true}),
            json!([{"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}]),
        );
        check(&by_condition, Suspended, Some("Job suspended"));
        let by_spec = job_with(json!({"suspend": true}), json!([]));
        check(&by_spec, Suspended, Some("Job is suspended"));
        // Resumed: the condition stays, False, and the Job is running again.
        let resumed = job_with(
            json!({}),
            json!([{"type": "Suspended", "status": "False", "reason": "JobResumed"}]),
        );
        check(&resumed, Progressing, Some("Waiting for Job to complete"));
    }

    #[test]
    fn job_running_is_progressing() {
        check(
            &job_with(json!({}), Value::Null),
            Progressing,
            Some("Waiting for Job to complete"),
        );
    }

    #[test]
    fn cronjob_suspended() {
        let o = cron(
            json!({"suspend": true}),
            json!({"lastScheduleTime": "2024-01-01T00:00:00Z"}),
        );
        check(&o, Suspended, Some("CronJob is Suspended"));
    }

    #[test]
    fn cronjob_active_is_progressing() {
        let o = cron(
            json!({}),
            json!({"active": [{"name": "web-1"}, {"name": "web-2"}]}),
        );
        check(&o, Progressing, Some("Waiting for 2 Jobs to complete"));
    }

    #[test]
    fn cronjob_last_run_failed_is_degraded() {
        let failed = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z", "lastSuccessfulTime": "2024-01-01T00:00:07Z"}),
        );
        check(
            &failed,
            Degraded,
            Some("CronJob has not completed its last execution successfully"),
        );
        let never = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z"}),
        );
        check(
            &never,
            Degraded,
            Some("CronJob has not completed its last execution successfully"),
        );
    }

    #[test]
    fn cronjob_healthy() {
        let ok = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z", "lastSuccessfulTime": "2024-01-02T00:00:09Z"}),
        );
        check(
            &ok,
            Healthy,
            Some("CronJob has completed its last execution successfully"),
        );
        check(&cron(json!({}), json!({})), Healthy, None);
        let no_status =
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "web"}});
        check(&no_status, Progressing, Some("Waiting for CronJob"));
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            // Job
            (
                "failed job without message names its reason",
                job_with(
                    json!({}),
                    json!([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]),
                ),
                Degraded,
                Some("DeadlineExceeded"),
            ),
            (
                "failed beats complete",
                job_with(
                    json!({}),
                    json!([{"type": "Complete", "status": "True"}, {"type": "Failed", "status": "True", "message": "x"}]),
                ),
                Degraded,
                Some("x"),
            ),
            (
                "complete without message",
                job_with(json!({}), json!([{"type": "Complete", "status": "True"}])),
                Healthy,
                None,
            ),
            (
                "a suspended job that already failed stays failed",
                job_with(
                    json!({"suspend": true}),
                    json!([{"type": "Failed", "status": "True", "message": "x"}]),
                ),
                Degraded,
                Some("x"),
            ),
            // CronJob
            (
                "suspended beats active",
                cron(json!({"suspend": true}), json!({"active": [{"name": "a"}]})),
                Suspended,
                Some("CronJob is Suspended"),
            ),
            (
                "active beats a failed last run",
                cron(
                    json!({}),
                    json!({"active": [{"name": "a"}], "lastScheduleTime": "2024-01-02T00:00:00Z"}),
                ),
                Progressing,
                Some("Waiting for 1 Jobs to complete"),
            ),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
