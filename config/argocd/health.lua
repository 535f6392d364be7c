-- Argo CD health check for topology.shardkeeper.dev/ShardTopology.
-- Reads the kstatus-style conditions the operator writes: a rollout in
-- progress is Progressing, a stalled one Degraded, a paused one or one
-- whose plan waits for approval Suspended,
-- and only Ready=True at the current generation is Healthy.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
local conds = {}
for _, c in ipairs(obj.status.conditions) do
  conds[c.type] = c
end
local function is(t, s)
  return conds[t] ~= nil and conds[t].status == s
end
local function msg(t)
  local c = conds[t]
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end
if is("Stalled", "True") then
  hs.status = "Degraded"
  hs.message = msg("Stalled")
elseif conds["Ready"] ~= nil and (conds["Ready"].reason == "AwaitingApproval" or conds["Ready"].reason == "ApprovalRefused") then
  -- spec.rollout.approval: Manual: the plan waits for a person.
  hs.status = "Suspended"
  hs.message = msg("Ready")
elseif is("RolloutPaused", "True") and not is("Ready", "True") then
  hs.status = "Suspended"
  hs.message = msg("RolloutPaused")
elseif is("Ready", "True") and not is("Reconciling", "True") then
  hs.status = "Healthy"
  hs.message = msg("Ready")
elseif is("Reconciling", "True") then
  hs.status = "Progressing"
  hs.message = msg("Reconciling")
else
  hs.status = "Progressing"
  if conds["Ready"] ~= nil then
    hs.message = msg("Ready")
  else
    hs.message = "Waiting for the Ready condition"
  end
end
return hs
