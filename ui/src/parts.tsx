// Small pieces shared by the pages: loading and errors, tables, the lag chart, an action that asks to confirm.
import { Badge, Box, Button, HStack, Heading, Link, Spinner, Table, Text } from "@chakra-ui/react";
import { useCallback, useEffect, useRef, useState, type ReactNode } from "react";

import { ApiError, get, root, trigger, type LagPoint, type PipelinePage, type Problem } from "./api";

/** Load ``fetcher`` now and on ``reload()``; a response that arrives after a newer load started is dropped. */
export function useLoad<T>(fetcher: () => Promise<T>, deps: unknown[]) {
  const [state, setState] = useState<{ data?: T; error?: ApiError | Error; loading: boolean }>({ loading: true });
  const seq = useRef(0);
  const reload = useCallback(() => {
    const mine = ++seq.current;
    setState((s) => ({ ...s, loading: true }));
    fetcher().then(
      (data) => { if (mine === seq.current) setState({ data, loading: false }); },
      (error) => { if (mine === seq.current) setState({ error, loading: false }); },
    );
  }, deps);
  useEffect(reload, [reload]);
  return { ...state, reload };
}

export function Loading({ error, what }: { error?: Error; what: string }) {
  if (error) {
    const denied = error instanceof ApiError && error.status === 403;
    return <Text color="fg.error" data-testid={denied ? "no-access" : "load-error"}>
      {denied ? `No access: ${error.message}` : `Could not load ${what}: ${error.message}`}</Text>;
  }
  return <Spinner size="sm" />;
}

export function Section({ title, children }: { title: string; children: ReactNode }) {
  return (
    <Box mt={5}>
      <Heading size="md" mb={2}>{title}</Heading>
      {children}
    </Box>
  );
}

export function Rows({ head, rows, id, rowClass }: { head: string[]; rows: ReactNode[][]; id?: string; rowClass?: string }) {
  if (!rows.length) return <Text color="fg.muted">none</Text>;
  return (
    <Table.Root size="sm" variant="outline" id={id} width="auto">
      <Table.Header>
        <Table.Row>{head.map((h) => <Table.ColumnHeader key={h}>{h}</Table.ColumnHeader>)}</Table.Row>
      </Table.Header>
      <Table.Body>
        {rows.map((r, i) => (
          <Table.Row key={i} className={rowClass}>{r.map((c, j) => <Table.Cell key={j}>{c}</Table.Cell>)}</Table.Row>
        ))}
      </Table.Body>
    </Table.Root>
  );
}

export const Verdict = ({ ok, yes, no }: { ok: boolean; yes: string; no: string }) =>
  <Badge colorPalette={ok ? "green" : "red"}>{ok ? yes : no}</Badge>;

export const airflowLink = (path: string) => root(path.replace(/^\//, ""));

export const DocsLink = ({ page }: { page: string | null }) =>
  page ? <Link href={root(`tidewater/data-docs/${page}`)} target="_blank" colorPalette="blue">Data Docs</Link> : null;

/** Lag when each batch was planned (from the ledger), oldest to newest, the lag now last: an SVG line chart. */
export function LagChart({ points, now }: { points: LagPoint[]; now: number }) {
  if (points.length < 2) return <Text color="fg.muted">fewer than two batches so far: no chart yet</Text>;
  const all = [...points.map((p) => p.lag), now];
  const w = 520, h = 120, max = Math.max(...all, 1);
  const xy = all.map((v, i) => `${((i * w) / (all.length - 1)).toFixed(1)},${(h - (v * h) / max).toFixed(1)}`).join(" ");
  return (
    <Box color="blue.500">
      <svg id="lag-chart" width={w} height={h + 4} role="img" aria-label="lag over time">
        <rect x={0} y={0} width={w} height={h + 4} fill="none" stroke="currentColor" strokeOpacity={0.25} />
        <polyline fill="none" stroke="currentColor" strokeWidth={2} points={xy} />
      </svg>
      <Text fontSize="xs" color="fg.muted">
        records behind when each of the last {points.length} batches was planned (the ledger), then now; max {max}
        {points.some((p) => p.capped) ? " (a batch capped by batch.max_records marks a lower bound)" : ""}
      </Text>
    </Box>
  );
}

/** A button that triggers a DAG run: the first click arms it ("Confirm ..."), the second sends it. */
export function RunButton({ label, dagId, conf, className, action, resultId, onDone }: {
  label: string; dagId: string; conf: Record<string, unknown>; className?: string; action?: string; resultId: string;
  onDone?: (runId: string) => void;
}) {
  const [armed, setArmed] = useState(false);
  const [busy, setBusy] = useState(false);
  const [result, setResult] = useState<ReactNode>(null);
  const click = async () => {
    if (!armed) { setArmed(true); return; }
    setBusy(true);
    try {
      const runId = await trigger(dagId, conf);
      setResult(<>queued run <Link id={resultId} colorPalette="blue"
        href={airflowLink(`dags/${dagId}/runs/${encodeURIComponent(runId)}`)}>{runId}</Link></>);
      onDone?.(runId);
    } catch (e) {
      setResult(<Text as="span" color="fg.error">{(e as Error).message}</Text>);
    }
  };
  return (
    <>
      <Button size="xs" variant={armed ? "solid" : "outline"} colorPalette={armed ? "orange" : "gray"} className={className}
        data-action={action} disabled={busy} onClick={click}>{armed ? `Confirm ${label.toLowerCase()}` : label}</Button>
      {result ? <Text as="span" ml={2} fontSize="sm">{result}</Text> : null}
    </>
  );
}

/** Every pipeline the user may read, each with its overview (null when it could not be loaded): the navigation page's
 * list and the dashboard panel. ``nonce`` reloads it. */
/** A page of the pipelines the user may read, one line each (the server asks each broker once for the page). */
export function usePipelinePage(nonce: number, offset: number) {
  return useLoad(() => get<PipelinePage>(`summaries?offset=${offset}`), [nonce, offset]);
}

/** "pipelines 51-100 of 500" with Previous and Next: nothing when one page holds them all. */
export function Pager({ page, onOffset }: { page: PipelinePage; onOffset: (offset: number) => void }) {
  if (page.total <= page.limit && page.offset === 0) return null;
  const last = Math.min(page.offset + page.pipelines.length, page.total);
  return (
    <HStack mt={2} className="pager">
      <Text fontSize="sm" color="fg.muted">{`pipelines ${page.offset + 1}-${last} of ${page.total}`}</Text>
      <Button size="xs" variant="outline" className="previous" disabled={page.offset === 0}
        onClick={() => onOffset(Math.max(0, page.offset - page.limit))}>Previous</Button>
      <Button size="xs" variant="outline" className="next" disabled={last >= page.total}
        onClick={() => onOffset(page.offset + page.limit)}>Next</Button>
    </HStack>
  );
}

/** Pipeline files that do not load on the API server (a variable unset on this host, a mistake in the file), for
 * users who may read their failing DAG: shown, never silently left out. Nothing when there are none. */
export function Problems({ id, nonce }: { id: string; nonce: number }) {
  const found = useLoad(() => get<Problem[]>("problems"), [nonce]);
  if (found.error) return <Loading error={found.error} what="the pipeline files' problems" />;
  if (!found.data || !found.data.length) return null;
  return (
    <Box mt={3}>
      <Text fontWeight="semibold" color="fg.error">Pipeline files that do not load here</Text>
      <Rows id={id} rowClass="pipeline-problem" head={["file", "DAG", "error"]}
        rows={found.data.map((p) => [p.file,
          <Link key="d" colorPalette="blue" href={airflowLink(`dags/${p.dag_id}`)}>{p.dag_id}</Link>,
          <Text key="e" color="fg.error" whiteSpace="pre-wrap">{p.error}</Text>])} />
    </Box>
  );
}
