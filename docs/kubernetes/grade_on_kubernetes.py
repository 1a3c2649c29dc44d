"""Grade a class on Kubernetes, through dask-kubernetes' operator (README, "Grading a course": set-up 3).

    pip install "labkit[instructor,kubernetes]"
    python docs/kubernetes/grade_on_kubernetes.py submissions/ registry.example/labkit-grader:0.1.0 16

The image must hold labkit with the instructor extra at the client's versions, and bubblewrap. Each worker pod has
its own user namespace (``hostUsers: false``, a runtime that supports it) and an unmasked /proc for the sandbox's
own (``procMount: Unmasked``, allowed with ``hostUsers: false``; bubblewrap#284), one CPU, and the grading secret
mounted from the Kubernetes Secret ``labkit-grading-secret`` (key ``secret``) at /var/run/labkit/secret: the
scheduler is reached through a port-forward on loopback, plain TCP, so the secret does not travel.

What has been run (tests/test_instructor_kubernetes.py): :func:`labkit_cluster_spec`, validated against the
DaskCluster schema dask-kubernetes 2026.3.0 ships: every value of its type, every field a known one but
``hostUsers``, which that schema's PodSpec predates, so the API server drops it; where the cluster's nodes do not put
pods in their own user namespace anyway, the workers refuse, saying that bubblewrap cannot make its namespaces. What
has not been run: the operator, a cluster, the pods, this file's ``__main__``.
"""

from __future__ import annotations

import sys

SECRET_MOUNT = "/var/run/labkit/secret"


def labkit_cluster_spec(image: str, n_workers: int) -> dict:
    """The DaskCluster resource: one single-threaded worker per pod, the nanny's memory limit off, the scheduler's
    worker-saturation 1.0 and allowed failures 3 (as labkit's local cluster), pods that can wall off submissions."""
    from dask_kubernetes.operator import make_cluster_spec

    spec = make_cluster_spec(
        name="labkit-grade", image=image, n_workers=n_workers,
        resources={"requests": {"cpu": "1", "memory": "8Gi"}, "limits": {"cpu": "1"}},
        env={"DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0",
             "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "3"},
        worker_command=["dask", "worker", "--nthreads", "1", "--memory-limit", "0"])
    pod = spec["spec"]["worker"]["spec"]
    pod["hostUsers"] = False
    pod["volumes"] = [{"name": "labkit-secret", "secret": {"secretName": "labkit-grading-secret"}}]
    worker = pod["containers"][0]
    worker["securityContext"] = {"procMount": "Unmasked"}
    worker["volumeMounts"] = [{"name": "labkit-secret", "mountPath": SECRET_MOUNT.rsplit("/", 1)[0],
                               "readOnly": True}]
    return spec


if __name__ == "__main__":  # not run by the tests: it needs a Kubernetes cluster with the operator
    from dask_kubernetes.operator import KubeCluster

    from labkit.instructor.cluster.classroom import grade_class

    folder, image, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with KubeCluster(custom_cluster_spec=labkit_cluster_spec(image, workers)) as cluster:
        grade_class(folder, folder.rstrip("/") + "-grades", scheduler=cluster.scheduler_address,
                    worker_secret_file=SECRET_MOUNT)
