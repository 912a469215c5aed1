"""Video jobs (OpenAI's Videos API): records in SQLite, videos in a folder or fsspec URL, run as ordinary sessions.

`records` (what a job is), `store` (SQLite), `content` (finished MP4s),
`runner` (one job's session on the WorldModel replicas), `manager` (a job's
life, queue and expiry), `server` (the single-replica VideoJobs deployment).
"""
