"""Which failure a failed XGBoost chunk reports, from the tasks Spark recorded (the messages
are the ones a two-rank chunk with rank 1 failing left in Spark's status store)."""

from sparkdist.models._xgboost_checkpoints import _cause

OWN = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
       "sparkdist.failpoints.FailpointError: failpoint xgboost.round fired (2): rank 1, "
       "epoch 1, step 0\n\tat org.apache.spark.api.python.BasePythonRunner")
PEER = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        "xgboost.core.XGBoostError: [09:47:47] /__w/xgboost/xgboost/src/collective/result.cc:83:"
        " [histogram.h:197|09:47:47]:\n\n"
        "- [allreduce.cc:135|09:47:47]: Ring Allreduce failed.\n"
        "- [allreduce.cc:101|09:47:47]: Ring scatter reduce failed, current iteration:0\n")
KILLED = "Stage cancelled: Task ResultTask(28, 1) from barrier stage ResultStage 28 failed."


def test_the_failing_ranks_own_error_wins_over_its_peers_symptom():
    cause = _cause([("FAILED", 0, PEER), ("FAILED", 1, OWN)], "job error")
    assert cause.endswith("failpoint xgboost.round fired (2): rank 1, epoch 1, step 0")
    assert "\tat " not in cause  # the JVM stack is cut


def test_a_killed_peer_leaves_its_own_error_when_it_reported_first():
    cause = _cause([("FAILED", 1, OWN), ("KILLED", 0, KILLED)], "job error")
    assert "failpoint xgboost.round fired (2): rank 1" in cause


def test_a_rank_killed_before_its_error_arrived_is_named_with_where_to_look():
    cause = _cause([("FAILED", 0, PEER), ("KILLED", 1, KILLED)], "job error")
    assert cause == ("rank(s) 0 lost a peer in xgboost's collective (Ring Allreduce failed.), "
                     "and Spark killed the task(s) of rank(s) 1 before they reported their own"
                     " error: the failure that started it is in the executor log of one of "
                     "those ranks")


def test_without_recorded_tasks_the_jobs_own_error_is_reported():
    assert _cause([], "Job aborted due to stage failure\n\tat x") == (
        "Job aborted due to stage failure")
    assert _cause([("FAILED", 0, PEER)], "job error").startswith(
        "org.apache.spark.api.python.PythonException")
