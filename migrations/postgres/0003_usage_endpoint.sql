-- Which route served each metered request: Moderato's own `/v1/moderate`
-- or the OpenAI-compatible `/v1/moderations`. Every row before this
-- migration came from `/v1/moderate`. The billing view names its columns,
-- so it is unchanged and counts both routes.
ALTER TABLE usage_events
    ADD COLUMN endpoint TEXT NOT NULL DEFAULT 'moderate'
        CHECK (endpoint IN ('moderate', 'moderations'));
