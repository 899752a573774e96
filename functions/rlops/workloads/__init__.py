"""Programs that run as Ray jobs (on the cluster, never inside a Cloud Function)."""
