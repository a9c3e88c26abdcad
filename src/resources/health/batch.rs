//! Batch (gitops-engine health_job.go; argo-cd resource_customizations/batch/CronJob/health.lua).

use super::fields::*;
use super::Health;
use super::HealthStatus::*;
use crate::resources::tree::Tree;

/// As gitops-engine reads a Job: only the conditions' types count (a `Failed` or `Complete`
/// condition whatever its status; Kubernetes only ever sets them True), and `Suspended` counts
/// as an outcome too, Suspended only while True: a resumed Job keeps its condition, False, and
/// reads Healthy until it completes or fails. `spec.suspend` alone, with no condition yet, is
/// still Progressing: the controller has not acted on it. The message is the condition's own
/// (of Complete or Suspended, the later in the list), never its reason.
pub(super) fn job(obj: &Obj) -> Health {
    let (mut failed, mut complete, mut suspended) = (None, false, false);
    let mut message = "";
    for c in list_at(obj, &["status", "conditions"]) {
        let text = || str_at(c, &["message"]).unwrap_or("");
        match str_at(c, &["type"]) {
            Some("Failed") => {
                failed = Some(text());
                complete = true;
            }
            Some("Complete") => {
                complete = true;
                message = text();
            }
            Some("Suspended") => {
                complete = true;
                message = text();
                suspended |= str_at(c, &["status"]) == Some("True");
            }
            _ => {}
        }
    }
    match failed {
        _ if !complete => Health::new(Progressing, message),
        Some(failed) => Health::new(Degraded, failed),
        None if suspended => Health::new(Suspended, message),
        None => Health::new(Healthy, message),
    }
}

/// As Argo CD's current CronJob script: a suspended CronJob is Healthy (Argo's choice until its
/// Suspended status stops bubbling up to the application), a run in progress or one that never
/// succeeded is Healthy with a warning, and only a last run that failed, with no run since, is
/// Degraded. Timestamps are RFC 3339 UTC and compare correctly as text.
pub(super) fn cron_job(obj: &Obj) -> Health {
    let Some(spec) = obj.spec.filter(|s| !s.is_null()) else {
        // Argo's script errors on the missing spec (Unknown, with the script's error).
        return Health::new(Unknown, "CronJob has no spec");
    };
    if spec.get("suspend").and_then(Tree::as_bool) == Some(true) {
        return Health::new(Healthy, "CronJob is Suspended");
    }
    let Some(status) = obj.status.filter(|s| !s.is_null()) else {
        return Health::new(Progressing, "Waiting for CronJob");
    };
    let present = |key: &str| status.get(key).filter(|v| !v.is_null());
    if present("lastScheduleTime").is_none() {
        return Health::new(Healthy, "CronJob has not been scheduled yet");
    }
    if present("lastSuccessfulTime").is_none() {
        return Health::new(
            Healthy,
            "The CronJob never completed successfully. It may not be healthy",
        );
    }
    if !list_at(status, &["active"]).is_empty() {
        return Health::new(
            Healthy,
            "The job is running. Its last execution may not have been successful",
        );
    }
    let scheduled = str_at(status, &["lastScheduleTime"]).unwrap_or("");
    match str_at(status, &["lastSuccessfulTime"]) {
        Some(succeeded) if succeeded < scheduled => Health::new(
            Degraded,
            "CronJob has not completed its last execution successfully",
        ),
        _ => Health::new(
            Healthy,
            "CronJob has completed its last execution successfully",
        ),
    }
}

// ---------------------------------------------------------------------------------------------

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{json, Value};

    use super::super::testing::*;

    use super::super::HealthStatus::*;

    // --- Job -------------------------------------------------------------------------------

    #[test]
    fn job_complete_is_healthy() {
        let o = job_with(
            json!({}),
            json!([{"type": "Complete", "status": "True", "message": "done"}]),
        );
        check(&o, Healthy, Some("done"));
    }

    #[test]
    fn job_failed_is_degraded_with_the_conditions_message_only() {
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
        // The reason is not put in the message's place.
        let silent = job_with(
            json!({}),
            json!([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]),
        );
        check(&silent, Degraded, None);
    }

    #[test]
    fn job_failed_or_complete_counts_whatever_its_status() {
        let failed_false = job_with(
            json!({}),
            json!([{"type": "Failed", "status": "False", "message": "x"}]),
        );
        check(&failed_false, Degraded, Some("x"));
        let complete_false = job_with(
            json!({}),
            json!([{"type": "Complete", "status": "False", "message": "y"}]),
        );
        check(&complete_false, Healthy, Some("y"));
    }

    #[test]
    fn job_suspended_by_its_condition_only() {
        let by_condition = job_with(
            json!({"suspend": true}),
            json!([{"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}]),
        );
        check(&by_condition, Suspended, Some("Job suspended"));
        // Asked to suspend, not yet suspended by the controller: still running.
        let by_spec = job_with(json!({"suspend": true}), json!([]));
        check(&by_spec, Progressing, None);
        // Resumed: the condition stays, False; the Job reads Healthy with its message.
        let resumed = job_with(
            json!({}),
            json!([{"type": "Suspended", "status": "False", "reason": "JobResumed", "message": "Job resumed"}]),
        );
        check(&resumed, Healthy, Some("Job resumed"));
        // Suspended once, then resumed and completed.
        let done = job_with(
            json!({}),
            json!([{"type": "Suspended", "status": "False", "message": "Job resumed"},
                   {"type": "Complete", "status": "True", "message": "finished"}]),
        );
        check(&done, Healthy, Some("finished"));
    }

    #[test]
    fn job_running_is_progressing_without_a_message() {
        check(&job_with(json!({}), Value::Null), Progressing, None);
        // Conditions of newer controllers alone are not an outcome.
        let target = job_with(
            json!({}),
            json!([{"type": "FailureTarget", "status": "True", "message": "x"},
                   {"type": "SuccessCriteriaMet", "status": "True"}]),
        );
        check(&target, Progressing, None);
    }

    // --- CronJob ---------------------------------------------------------------------------

    #[test]
    fn cronjob_suspended_is_healthy() {
        let o = cron(
            json!({"suspend": true}),
            json!({"active": [{"name": "a"}], "lastScheduleTime": "2024-01-01T00:00:00Z"}),
        );
        check(&o, Healthy, Some("CronJob is Suspended"));
    }

    #[test]
    fn cronjob_running_or_never_succeeded_is_healthy_with_a_warning() {
        let never = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z"}),
        );
        check(
            &never,
            Healthy,
            Some("The CronJob never completed successfully. It may not be healthy"),
        );
        let running = cron(
            json!({}),
            json!({"active": [{"name": "web-1"}], "lastScheduleTime": "2024-01-02T00:00:00Z",
                   "lastSuccessfulTime": "2024-01-01T00:00:07Z"}),
        );
        check(
            &running,
            Healthy,
            Some("The job is running. Its last execution may not have been successful"),
        );
        // Never succeeded comes before running.
        let first_run = cron(
            json!({}),
            json!({"active": [{"name": "web-1"}], "lastScheduleTime": "2024-01-02T00:00:00Z"}),
        );
        check(
            &first_run,
            Healthy,
            Some("The CronJob never completed successfully. It may not be healthy"),
        );
    }

    #[test]
    fn cronjob_last_run_failed_is_degraded() {
        let failed = cron(
            json!({}),
            json!({"active": [], "lastScheduleTime": "2024-01-02T00:00:00Z", "lastSuccessfulTime": "2024-01-01T00:00:07Z"}),
        );
        check(
            &failed,
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
        // Equal times: not before, so the last run succeeded.
        let same = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z", "lastSuccessfulTime": "2024-01-02T00:00:00Z"}),
        );
        check(
            &same,
            Healthy,
            Some("CronJob has completed its last execution successfully"),
        );
    }

    #[test]
    fn cronjob_not_scheduled_yet_or_without_status() {
        // An empty status is a status.
        check(
            &cron(json!({}), json!({})),
            Healthy,
            Some("CronJob has not been scheduled yet"),
        );
        let no_status = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "web"},
                               "spec": {"schedule": "* * * * *"}});
        check(&no_status, Progressing, Some("Waiting for CronJob"));
        let null_status = cron(json!({}), Value::Null);
        check(&null_status, Progressing, Some("Waiting for CronJob"));
        // Any version: Argo's script is for the group and kind.
        let beta = obj(
            "batch/v1beta1",
            "CronJob",
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z"}),
        );
        check(
            &beta,
            Healthy,
            Some("The CronJob never completed successfully. It may not be healthy"),
        );
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            // Job
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
                    json!([{"type": "Failed", "status": "True", "message": "x"},
                           {"type": "Suspended", "status": "True", "message": "s"}]),
                ),
                Degraded,
                Some("x"),
            ),
            (
                "the later of Complete and Suspended gives the message",
                job_with(
                    json!({}),
                    json!([{"type": "Complete", "status": "True", "message": "done"},
                           {"type": "Suspended", "status": "False", "message": "resumed"}]),
                ),
                Healthy,
                Some("resumed"),
            ),
            (
                "a job of another version",
                obj("batch/v2", "Job", json!({}), json!({})),
                Unknown,
                Some("unsupported Job GVK: batch/v2, Kind=Job"),
            ),
            // CronJob
            (
                "a cronjob without spec",
                json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"}, "status": {}}),
                Unknown,
                Some("CronJob has no spec"),
            ),
            (
                "suspend false is not suspended",
                cron(json!({"suspend": false}), json!({})),
                Healthy,
                Some("CronJob has not been scheduled yet"),
            ),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
