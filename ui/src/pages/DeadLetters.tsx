// A pipeline's dead letters: counts by class and state, the letters themselves (class, message, source topic,
// partition and offset, a preview of the payload), and a retry through the retry DAG (a run, recorded with who asked).
import { Code, HStack, NativeSelect, Stack, Text } from "@chakra-ui/react";
import { useState } from "react";

import { get, type Letter, type LetterClass, type PipelineRef } from "../api";
import { Loading, Rows, RunButton, useLoad } from "../parts";

const STATES = ["open", "resolved", "skipped", "dropped", "retrying", "all"];

export function DeadLetters({ pipeline, classes, counts }: { pipeline: PipelineRef; classes: LetterClass[];
  counts: Record<string, number> }) {
  const [state, setState] = useState("open");
  const [errorClass, setErrorClass] = useState("");
  const name = encodeURIComponent(pipeline.name);
  const query = `state=${state}&limit=50${errorClass ? `&error_class=${encodeURIComponent(errorClass)}` : ""}`;
  const letters = useLoad(() => get<{ letters: Letter[]; matching: number }>(`pipelines/${name}/dead-letters?${query}`),
    [name, query]);
  return (
    <Stack gap={2} id="dead-letters">
      <Text fontSize="sm">{Object.entries(counts).filter(([k]) => k !== "total").map(([k, n]) => `${n} ${k}`).join(", ")}</Text>
      <Rows head={["error class", "count"]} rows={classes.map((c) => [c.error_class, c.count])} />
      <HStack>
        <NativeSelect.Root size="xs" width="10rem">
          <NativeSelect.Field id="letter-state" value={state} onChange={(e) => setState(e.currentTarget.value)}>
            {STATES.map((s) => <option key={s} value={s}>{s}</option>)}
          </NativeSelect.Field>
        </NativeSelect.Root>
        <NativeSelect.Root size="xs" width="14rem">
          <NativeSelect.Field id="letter-class" value={errorClass} onChange={(e) => setErrorClass(e.currentTarget.value)}>
            <option value="">every class</option>
            {classes.map((c) => <option key={c.error_class} value={c.error_class}>{c.error_class}</option>)}
          </NativeSelect.Field>
        </NativeSelect.Root>
        {counts.open && pipeline.retry_dag_id ? <RunButton label={`Retry ${errorClass || "open letters"}`} dagId={pipeline.retry_dag_id}
          resultId="retry-run" className="retry-letters"
          conf={{ dry_run: false, ...(errorClass ? { error_class: errorClass } : {}) }} /> : null}
      </HStack>
      {letters.data ? <>
        <Rows id="letters" rowClass="letter" head={["where", "class", "message", "state", "payload"]}
          rows={letters.data.letters.map((l) => [`${l.topic}[${l.partition}]@${l.offset}`, l.error_class,
            <Text fontSize="xs" maxW="28rem">{(l.reason || l.error_message || "").slice(0, 300)}</Text>,
            l.status, <Code fontSize="xs" className="payload" maxW="24rem" whiteSpace="pre-wrap">{l.payload_preview ?? ""}</Code>])} />
        {letters.data.matching > letters.data.letters.length ?
          <Text fontSize="sm" color="fg.muted">{letters.data.matching - letters.data.letters.length} more</Text> : null}
      </> : <Loading error={letters.error} what="the dead letters" />}
    </Stack>
  );
}
