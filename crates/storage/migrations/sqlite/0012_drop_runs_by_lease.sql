-- runs_by_lease (lease_expires_at, running runs only) was written on every claim, lease
-- renewal and run end, and read by nothing: its one intended reader, the claim's search for
-- runs whose worker died (`status = 'running' AND lease_expires_at < ?`), is planned on
-- runs_to_claim (status first), which holds the running runs together, and there are at most
-- as many of those as all processes' workers. One B-tree fewer for every run to update and
-- for every commit to write a page of.
DROP INDEX runs_by_lease;
