-- Joined views over the ingested tables (store/sql.py runs these after the
-- base views, one statement per view, separated by lines that read `-- view`).
--
-- The ingested tables are append-only halves (a request and its response, a
-- tool call and its result, a rollout's start and end) that arrive at
-- different times; these views join them at query time, so a late half shows
-- up as soon as it is ingested. A key seen twice (a harness that retried with
-- a fresh event id) keeps its first row by seq (for a response: the first without
-- an error); a rollout's end keeps its last.
-- Shapes (measured, DuckDB 1.5): a query reads only the columns it names, so no
-- CTE is read twice (DuckDB materializes it with every column of the view, token
-- lists included). DuckDB does not drop an unused LEFT JOIN inside a view, so
-- every half is deduplicated whatever a query reads: one GROUP BY on the key
-- (arg_min_null/arg_max_null of each column over the rank) where the rows are
-- small; requests, whose prompt token lists are slow through an aggregate,
-- stream instead (only the rows of keys seen more than once are ranked).
-- Duplicate keys are joined, not anti/semi joined, so that a filter on the key
-- (one rollout) reaches their GROUP BY too.
-- Token ids stay list<int32> and logprobs list<float32>: token-exact. Counts
-- come from the n_*_tokens columns, never from the arrays, so scalar queries
-- do not read token ids at all.

-- view
CREATE VIEW llm_calls AS
WITH -- copies can share an event id (the ingester's dedupe window is bounded; test lakes are written raw):
-- ranking keeps exactly one
request AS (
    SELECT h.* FROM llm_requests AS h
    LEFT JOIN (SELECT tenant, rollout_id, call_id, true AS dup FROM llm_requests GROUP BY ALL HAVING count(*) > 1) AS d
        USING (tenant, rollout_id, call_id)
    WHERE d.dup IS NULL
    UNION ALL
    SELECT h.* FROM llm_requests AS h
    JOIN (SELECT tenant, rollout_id, call_id FROM llm_requests GROUP BY ALL HAVING count(*) > 1) AS d
        USING (tenant, rollout_id, call_id)
    QUALIFY row_number() OVER (PARTITION BY h.tenant, h.rollout_id, h.call_id ORDER BY h.seq, h.ts, h.event_id) = 1
), -- a keyed retry can answer one call twice (an error, then a success): prefer the success. Responses carry
-- short token lists: one GROUP BY (arg_min_null of each column over the rank) costs less than the two above
response AS (
    SELECT tenant, rollout_id, call_id,
        arg_min_null(COLUMNS(* EXCLUDE (tenant, rollout_id, call_id, rank_)), rank_)
    FROM (SELECT *, (error IS NOT NULL, seq, ts, event_id) AS rank_ FROM llm_responses)
    GROUP BY tenant, rollout_id, call_id
)
SELECT
    q.tenant, q.task_id, q.rollout_id, q.attempt, q.seq, q.call_id,
    q.span_id, q.parent_span_id,
    q.harness_name, q.harness_version, q.harness_config_hash,
    q.model, q.messages, q.prompt, q.tools, q.params,
    q.prompt_token_ids,
    q.n_prompt_tokens,
    q.tokenizer, q.chat_template_hash, q.idempotency_key,
    q.extends_call_id, q.extends_tokens,
    r.text, r.tool_calls, r.finish_reason,
    r.response_token_ids, r.logprobs,
    r.n_response_tokens,
    r.token_source, r.usage, r.latency_ms, r.upstream_retries, r.policy_version, r.error,
    r.event_id IS NOT NULL AS has_response,
    q.ts AS requested_at, r.ts AS responded_at,
    q.event_id AS request_event_id, r.event_id AS response_event_id,
    r.seq AS response_seq
FROM request AS q
LEFT JOIN response AS r
    ON r.tenant = q.tenant AND r.rollout_id = q.rollout_id AND r.call_id = q.call_id;

-- view
CREATE VIEW tool_steps AS
WITH call AS (
    SELECT tenant, rollout_id, call_id,
        arg_min_null(COLUMNS(* EXCLUDE (tenant, rollout_id, call_id, rank_)), rank_)
    FROM (SELECT *, (seq, ts, event_id) AS rank_ FROM tool_calls)
    GROUP BY tenant, rollout_id, call_id
), result AS (
    SELECT tenant, rollout_id, call_id,
        arg_min_null(COLUMNS(* EXCLUDE (tenant, rollout_id, call_id, rank_)), rank_)
    FROM (SELECT *, (seq, ts, event_id) AS rank_ FROM tool_results)
    GROUP BY tenant, rollout_id, call_id
)
SELECT
    c.tenant, c.task_id, c.rollout_id, c.attempt, c.seq, c.call_id,
    c.span_id, c.parent_span_id,
    c.harness_name, c.harness_version, c.harness_config_hash,
    c.name, c.arguments,
    r.result, r.error, r.duration_ms, r.state_changed,
    r.event_id IS NOT NULL AS has_result,
    c.ts AS called_at, r.ts AS returned_at,
    c.event_id AS call_event_id, r.event_id AS result_event_id,
    r.seq AS result_seq
FROM call AS c
LEFT JOIN result AS r
    ON r.tenant = c.tenant AND r.rollout_id = c.rollout_id AND r.call_id = c.call_id;

-- view
-- One row per (tenant, rollout_id) seen in any typed table, so a rollout shows
-- up (status 'running') before its rollout.started or rollout.finished lands.
-- Rewards: `rewards` lists the latest value of each reward name (by ts, then
-- seq); `reward` is their sum (NULL when none); `n_rewards` counts every
-- reward event, re-scores included.
CREATE VIEW rollouts AS
WITH seen AS (
    SELECT tenant, rollout_id, task_id, attempt, ts, harness_name, harness_version, harness_config_hash FROM rollout_starts
    UNION ALL SELECT tenant, rollout_id, task_id, attempt, ts, harness_name, harness_version, harness_config_hash FROM rollout_ends
    UNION ALL SELECT tenant, rollout_id, task_id, attempt, ts, harness_name, harness_version, harness_config_hash FROM llm_requests
    UNION ALL SELECT tenant, rollout_id, task_id, attempt, ts, harness_name, harness_version, harness_config_hash FROM tool_calls
    UNION ALL SELECT tenant, rollout_id, task_id, attempt, ts, harness_name, harness_version, harness_config_hash FROM rewards
), ids AS (
    SELECT tenant, rollout_id,
        arg_min(task_id, ts) AS task_id,
        arg_min(attempt, ts) AS attempt,
        arg_min(harness_name, ts) AS harness_name,
        arg_min(harness_version, ts) AS harness_version,
        arg_min(harness_config_hash, ts) AS harness_config_hash,
        min(ts) AS first_event_at,
        max(ts) AS last_event_at
    FROM seen GROUP BY tenant, rollout_id
), started AS (
    SELECT tenant, rollout_id,
        arg_min_null(COLUMNS(* EXCLUDE (tenant, rollout_id, rank_)), rank_)
    FROM (SELECT *, (seq, ts, event_id) AS rank_ FROM rollout_starts)
    GROUP BY tenant, rollout_id
), finished AS (
    SELECT tenant, rollout_id,
        arg_max_null(COLUMNS(* EXCLUDE (tenant, rollout_id, rank_)), rank_)
    FROM (SELECT *, (seq, ts, event_id) AS rank_ FROM rollout_ends)
    GROUP BY tenant, rollout_id
), calls AS (
    SELECT tenant, rollout_id,
        count(*) AS n_llm_calls,
        count(*) FILTER (WHERE error IS NOT NULL) AS n_llm_errors,
        sum(n_prompt_tokens) AS n_prompt_tokens,
        sum(n_response_tokens) AS n_response_tokens,
        sum(latency_ms) AS llm_latency_ms,
        arg_max(policy_version, seq) FILTER (WHERE policy_version IS NOT NULL) AS last_policy_version
    FROM llm_calls GROUP BY tenant, rollout_id
), tools AS (
    SELECT tenant, rollout_id,
        count(*) AS n_tool_calls,
        count(*) FILTER (WHERE error IS NOT NULL) AS n_tool_errors
    FROM tool_steps GROUP BY tenant, rollout_id
), latest_reward AS ( -- the latest value of each reward name; re-scores counted
    SELECT tenant, rollout_id, name,
        arg_max_null(value, (ts, seq, event_id)) AS value,
        arg_max_null(source, (ts, seq, event_id)) AS source,
        max(ts) AS ts,
        count(*) AS n_events
    FROM rewards GROUP BY tenant, rollout_id, name
), scored AS (
    SELECT tenant, rollout_id,
        sum(value) AS reward,
        sum(n_events)::BIGINT AS n_rewards,
        list({'name': name, 'value': value, 'source': source, 'ts': ts} ORDER BY name) AS rewards
    FROM latest_reward GROUP BY tenant, rollout_id
)
SELECT
    i.tenant, i.task_id, i.rollout_id,
    coalesce(s.group_id, i.task_id) AS group_id,
    i.attempt,
    coalesce(s.harness_name, i.harness_name) AS harness_name,
    coalesce(s.harness_version, i.harness_version) AS harness_version,
    coalesce(s.harness_config_hash, i.harness_config_hash) AS harness_config_hash,
    coalesce(s.policy_version, c.last_policy_version) AS policy_version,
    s.metadata,
    s.ts AS started_at,
    f.ts AS finished_at,
    coalesce(f.status, 'running') AS status,
    f.reason,
    f.steps,
    coalesce(c.n_llm_calls, 0) AS n_llm_calls,
    coalesce(c.n_llm_errors, 0) AS n_llm_errors,
    coalesce(t.n_tool_calls, 0) AS n_tool_calls,
    coalesce(t.n_tool_errors, 0) AS n_tool_errors,
    coalesce(c.n_prompt_tokens, 0)::BIGINT AS n_prompt_tokens,
    coalesce(c.n_response_tokens, 0)::BIGINT AS n_response_tokens,
    c.llm_latency_ms,
    r.reward,
    coalesce(r.n_rewards, 0) AS n_rewards,
    r.rewards,
    i.first_event_at,
    i.last_event_at
FROM ids AS i
LEFT JOIN started AS s USING (tenant, rollout_id)
LEFT JOIN finished AS f USING (tenant, rollout_id)
LEFT JOIN calls AS c USING (tenant, rollout_id)
LEFT JOIN tools AS t USING (tenant, rollout_id)
LEFT JOIN scored AS r USING (tenant, rollout_id);

-- view
-- One row per LLM call (as in llm_calls) with its FULL prompt ids: a call sent
-- with a prefix reference stores only the ids after the shared prefix, and
-- its prompt is (full prompt of extends_call_id + that call's response ids)
-- [:extends_tokens] + its own ids, resolved here along the chain inside
-- (tenant, rollout_id). `resolved` is false (prompt_token_ids NULL) when the
-- chain cannot be followed: a referenced call missing (not ingested yet, or
-- forgotten), a reference longer than what it names, or no ids. The chain is
-- followed over the whole lake: filter llm_calls yourself for one rollout of a
-- big lake (store.prompts resolves in Python).
CREATE VIEW llm_call_prompts AS
WITH RECURSIVE linked AS (
    SELECT tenant, rollout_id, call_id, CASE WHEN extends_tokens IS NOT NULL THEN extends_call_id END AS extends_call_id,
        extends_tokens, prompt_token_ids, response_token_ids
    FROM llm_calls  -- a call that references only messages (extends_tokens NULL) has its whole prompt
), resolved(tenant, rollout_id, call_id, prompt_token_ids, response_token_ids) AS (
    SELECT tenant, rollout_id, call_id, prompt_token_ids, response_token_ids
    FROM linked WHERE extends_call_id IS NULL AND prompt_token_ids IS NOT NULL
    UNION ALL
    SELECT c.tenant, c.rollout_id, c.call_id,
        list_concat(
            list_concat(p.prompt_token_ids, coalesce(p.response_token_ids, []::INTEGER[]))[1:c.extends_tokens],
            c.prompt_token_ids),
        c.response_token_ids
    FROM resolved AS p
    JOIN linked AS c ON c.tenant = p.tenant AND c.rollout_id = p.rollout_id AND c.extends_call_id = p.call_id
    WHERE c.extends_tokens <= len(p.prompt_token_ids) + coalesce(len(p.response_token_ids), 0)
)
SELECT
    c.tenant, c.task_id, c.rollout_id, c.attempt, c.seq, c.call_id, c.span_id,
    c.extends_call_id, c.extends_tokens,
    r.prompt_token_ids,
    c.n_prompt_tokens,
    r.call_id IS NOT NULL AS resolved
FROM llm_calls AS c
LEFT JOIN resolved AS r USING (tenant, rollout_id, call_id);

-- view
-- One row per LLM call (as in llm_calls) with its FULL messages and tools (JSON
-- text): a call sent with a messages reference stores only the messages after
-- the first extends_messages of the referenced call's full messages, and no
-- tools when extends_tools (they are that call's); extends_messages one past
-- those messages counts that call's answer too, rebuilt from its response as
-- schemas.answer_message does (content, role, tool_calls: id, function
-- {arguments, name}, type); resolved here along the chain inside (tenant,
-- rollout_id). `resolved` is false (messages and tools NULL) when the chain
-- cannot be followed: a referenced call missing, a reference longer than what
-- it names, or an answer counted without a successful response. Followed over
-- the whole lake: filter yourself for one rollout of a big lake
-- (store.messages resolves in Python).
CREATE VIEW llm_call_messages AS
WITH RECURSIVE linked AS (
    SELECT c.tenant, c.rollout_id, c.call_id, json_extract(c.messages, '$[*]') AS messages, c.tools,
        q.extends_call_id, q.extends_messages, coalesce(q.extends_tools, false) AS extends_tools,
        CASE WHEN NOT c.has_response OR c.error IS NOT NULL
                OR NOT list_bool_and(list_transform(json_extract(coalesce(c.tool_calls, '[]'), '$[*]'), t ->
                    coalesce(json_type(t, '$.id') = 'VARCHAR' AND json_type(t, '$.type') = 'VARCHAR'
                             AND json_type(t, '$.function.arguments') = 'VARCHAR'
                             AND json_type(t, '$.function.name') = 'VARCHAR', false)))
            THEN NULL
        ELSE json_merge_patch(
            CASE WHEN c.text IS NULL THEN json_object('role', 'assistant')
                 ELSE json_object('content', c.text, 'role', 'assistant') END,
            CASE WHEN coalesce(json_array_length(c.tool_calls), 0) = 0 THEN '{}'
                 ELSE json_object('tool_calls', to_json(list_transform(json_extract(c.tool_calls, '$[*]'), t ->
                     json_object('id', t->>'$.id', 'function', json_object('arguments', t->>'$.function.arguments',
                                 'name', t->>'$.function.name'), 'type', t->>'$.type')))) END) END AS answer
    FROM llm_calls AS c
    JOIN llm_requests AS q ON q.tenant = c.tenant AND q.rollout_id = c.rollout_id AND q.event_id = c.request_event_id
), resolved(tenant, rollout_id, call_id, messages, tools, answer) AS (
    SELECT tenant, rollout_id, call_id, messages, tools, answer
    FROM linked WHERE extends_messages IS NULL AND NOT extends_tools
    UNION ALL
    SELECT c.tenant, c.rollout_id, c.call_id,
        CASE WHEN c.extends_messages IS NULL THEN c.messages
             WHEN c.extends_messages <= len(p.messages) THEN list_concat(p.messages[1:c.extends_messages], c.messages)
             ELSE list_concat(p.messages, [p.answer], c.messages) END,
        CASE WHEN c.extends_tools THEN p.tools ELSE c.tools END,
        c.answer
    FROM resolved AS p
    JOIN linked AS c ON c.tenant = p.tenant AND c.rollout_id = p.rollout_id AND c.extends_call_id = p.call_id
    WHERE (c.extends_messages IS NOT NULL OR c.extends_tools)
        AND coalesce(c.extends_messages <= len(p.messages)
                     OR (c.extends_messages = len(p.messages) + 1 AND p.answer IS NOT NULL), c.extends_messages IS NULL)
)
SELECT
    c.tenant, c.task_id, c.rollout_id, c.attempt, c.seq, c.call_id, c.span_id,
    CAST(r.messages AS JSON)::VARCHAR AS messages,
    r.tools,
    r.call_id IS NOT NULL AS resolved
FROM llm_calls AS c
LEFT JOIN resolved AS r USING (tenant, rollout_id, call_id);
