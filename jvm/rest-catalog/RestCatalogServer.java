// The Iceberg REST catalog server of the tests (tidewater_dev.rest_catalog starts it): the routes of the Iceberg
// REST OpenAPI spec that pyiceberg and Iceberg's Spark runtime call, answered by Iceberg's own request handlers
// (org.apache.iceberg.rest.CatalogHandlers, which Iceberg's REST fixture routes to as well) over a JdbcCatalog on
// SQLite. Iceberg's fixture jar, Nessie's and Polaris' servers are not served from Maven Central here; this file is
// only the HTTP front (routing, JSON, errors, OAuth2 client credentials), the catalog logic is Iceberg's.
//
// Run from source (java -cp '.data/rest-catalog/libs/*' jvm/rest-catalog/RestCatalogServer.java). Settings come
// from the environment, never from the command line:
//   REST_PORT          port on 127.0.0.1 (0: any; the chosen port is printed as "listening on PORT")
//   REST_WAREHOUSE     the warehouse directory; REST_STORE the directory of the catalogs' SQLite files
//   A client's `warehouse` names its catalog: GET /v1/config?warehouse=W answers the prefix W, and the routes under
//   /v1/W/ use a JdbcCatalog named W (its tables under REST_WAREHOUSE/W), so tests sharing one server stay apart.
//   A warehouse that is an s3:// location is that bucket's, written through Iceberg's S3FileIO at REST_S3_ENDPOINT
//   (path-style) with the keys REST_S3_ACCESS_KEY and REST_S3_SECRET_KEY.
//   REST_CLIENT_ID, REST_CLIENT_SECRET  when set, every route but /v1/config and /v1/oauth/tokens needs a bearer
//                      token from POST /v1/oauth/tokens (client credentials)
//   REST_TOKEN_TTL     seconds a token lives (default 3600); an expired token is answered 401 so clients refresh
//   REST_FAIL_COMMITS  the next N table commits are refused with 409 CommitFailedException (conflict tests);
//                      POST /test/fail-commits?n=N sets it while running; GET /test/stats counts requests
//   POST /test/expire?max-age-ms=N  the catalog maintaining its tables itself, as S3 Tables does on its schedule:
//                      Iceberg's ExpireSnapshots on every table of every catalog, snapshots older than N ms expired
//                      (the current one and those a branch or tag references kept), their files deleted
//   POST /test/hold-transactions?ms=N  the next multi-table commit waits N ms after its requirements are checked and
//                      before it applies anything (a kill test kills the client meanwhile)
//
// The multi-table commit (POST /v1/{prefix}/transactions/commit, advertised in /v1/config's endpoints) checks every
// table's requirements, then applies every table's updates, under the lock every table commit of this server takes:
// no other commit comes between, and a refused requirement applies nothing. Iceberg's JdbcCatalog has no cross-table
// transaction, so a crash of this server between two tables' pointer swaps would leave the first applied; that is
// the one gap, and no test kills the server there. (CatalogHandlers has no handler for this route; Iceberg's own test
// adapter does the same two passes.)

import com.fasterxml.jackson.annotation.JsonAutoDetect;
import com.fasterxml.jackson.annotation.PropertyAccessor;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.PropertyNamingStrategies;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.MetadataUpdate;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableOperations;
import org.apache.iceberg.UpdateRequirement;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.exceptions.CommitStateUnknownException;
import org.apache.iceberg.exceptions.NamespaceNotEmptyException;
import org.apache.iceberg.exceptions.NoSuchNamespaceException;
import org.apache.iceberg.exceptions.NoSuchTableException;
import org.apache.iceberg.exceptions.NotAuthorizedException;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.rest.CatalogHandlers;
import org.apache.iceberg.rest.Endpoint;
import org.apache.iceberg.rest.RESTCatalogProperties;
import org.apache.iceberg.rest.RESTSerializers;
import org.apache.iceberg.rest.RESTUtil;
import org.apache.iceberg.rest.requests.CommitTransactionRequest;
import org.apache.iceberg.rest.requests.CreateNamespaceRequest;
import org.apache.iceberg.rest.requests.CreateTableRequest;
import org.apache.iceberg.rest.requests.RenameTableRequest;
import org.apache.iceberg.rest.requests.UpdateNamespacePropertiesRequest;
import org.apache.iceberg.rest.requests.UpdateTableRequest;
import org.apache.iceberg.rest.responses.ConfigResponse;
import org.apache.iceberg.rest.responses.ErrorResponse;
import org.apache.iceberg.rest.responses.OAuthTokenResponse;

public class RestCatalogServer {
  private static final ObjectMapper MAPPER = new ObjectMapper();
  private static final String SEP = "\u001f";
  private static final Map<String, JdbcCatalog> CATALOGS = new ConcurrentHashMap<>();
  private static final Map<String, String> LOCATIONS = new ConcurrentHashMap<>(); // prefix -> an s3:// warehouse
  private static String store;
  private static String warehouse;
  private static String clientId;
  private static String clientSecret;
  private static int tokenTtl;
  private static final Map<String, Long> TOKENS = new ConcurrentHashMap<>();
  private static final AtomicInteger FAIL_COMMITS = new AtomicInteger();
  private static final AtomicLong HOLD_TRANSACTION_MS = new AtomicLong();
  private static final Object COMMIT_LOCK = new Object(); // every table commit, single or multi-table
  private static final List<Endpoint> ENDPOINTS = List.of(
      Endpoint.V1_LIST_NAMESPACES, Endpoint.V1_LOAD_NAMESPACE, Endpoint.V1_NAMESPACE_EXISTS, Endpoint.V1_CREATE_NAMESPACE,
      Endpoint.V1_UPDATE_NAMESPACE, Endpoint.V1_DELETE_NAMESPACE, Endpoint.V1_LIST_TABLES, Endpoint.V1_LOAD_TABLE,
      Endpoint.V1_TABLE_EXISTS, Endpoint.V1_CREATE_TABLE, Endpoint.V1_UPDATE_TABLE, Endpoint.V1_DELETE_TABLE,
      Endpoint.V1_RENAME_TABLE, Endpoint.V1_REPORT_METRICS, Endpoint.V1_COMMIT_TRANSACTION);
  private static final Map<String, AtomicLong> STATS = new ConcurrentHashMap<>();

  /** An answer: HTTP status and the object to write as JSON (null: no body). */
  private record Answer(int status, Object body) {}

  public static void main(String[] args) throws Exception {
    Map<String, String> env = System.getenv();
    MAPPER.setVisibility(PropertyAccessor.FIELD, JsonAutoDetect.Visibility.ANY);
    MAPPER.configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false);
    MAPPER.setPropertyNamingStrategy(new PropertyNamingStrategies.KebabCaseStrategy());
    RESTSerializers.registerAll(MAPPER);
    clientId = env.get("REST_CLIENT_ID");
    clientSecret = env.get("REST_CLIENT_SECRET");
    tokenTtl = Integer.parseInt(env.getOrDefault("REST_TOKEN_TTL", "3600"));
    FAIL_COMMITS.set(Integer.parseInt(env.getOrDefault("REST_FAIL_COMMITS", "0")));
    store = env.get("REST_STORE");
    warehouse = env.get("REST_WAREHOUSE");
    HttpServer server =
        HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(env.getOrDefault("REST_PORT", "0"))), 64);
    server.createContext("/", RestCatalogServer::handle);
    server.setExecutor(Executors.newFixedThreadPool(8));
    server.start();
    System.out.println("listening on " + server.getAddress().getPort());
    System.out.flush();
  }

  private static void handle(HttpExchange ex) throws IOException {
    String method = ex.getRequestMethod();
    String path = ex.getRequestURI().getRawPath();
    Answer answer;
    try {
      STATS.computeIfAbsent(method + " " + routeName(path), k -> new AtomicLong()).incrementAndGet();
      answer = route(ex, method, path);
    } catch (NoSuchNamespaceException | NoSuchTableException e) {
      answer = error(404, e);
    } catch (AlreadyExistsException | CommitFailedException | NamespaceNotEmptyException e) {
      answer = error(409, e);
    } catch (NotAuthorizedException e) {
      answer = error(401, e);
    } catch (ValidationException | IllegalArgumentException e) {
      answer = error(400, e);
    } catch (CommitStateUnknownException e) {
      answer = error(500, e);
    } catch (RuntimeException e) { // any other failure of the catalog is the server's error, as the spec says
      e.printStackTrace();
      answer = error(500, e);
    }
    byte[] body = answer.body() == null ? new byte[0] : MAPPER.writeValueAsBytes(answer.body());
    ex.getResponseHeaders().set("Content-Type", "application/json");
    ex.sendResponseHeaders(answer.status(), body.length == 0 ? -1 : body.length);
    if (body.length > 0) {
      try (OutputStream out = ex.getResponseBody()) {
        out.write(body);
      }
    }
    ex.close();
  }

  /** The path with names replaced by placeholders, for the request counts. */
  private static String routeName(String path) {
    return path.replaceAll("^/v1/[^/]+/", "/v1/{prefix}/").replaceAll("/namespaces/[^/]+", "/namespaces/{ns}").replaceAll("/tables/(?!rename)[^/]+", "/tables/{t}");
  }

  private static Answer error(int status, Exception e) {
    return new Answer(status, ErrorResponse.builder().responseCode(status).withType(e.getClass().getSimpleName())
        .withMessage(String.valueOf(e.getMessage())).build());
  }

  /** The catalog a prefix names, made on first use. */
  private static JdbcCatalog catalog(String name) {
    return CATALOGS.computeIfAbsent(name, n -> {
      Map<String, String> props = new HashMap<>();
      props.put(CatalogProperties.URI, "jdbc:sqlite:" + store + "/" + n + ".db"); // a store per catalog: no lock shared
      props.put(CatalogProperties.WAREHOUSE_LOCATION, LOCATIONS.getOrDefault(n, warehouse + "/" + n));
      props.put("jdbc.schema-version", "V1");
      if (LOCATIONS.containsKey(n)) {
        Map<String, String> env = System.getenv();
        props.put(CatalogProperties.FILE_IO_IMPL, "org.apache.iceberg.aws.s3.S3FileIO");
        props.put("s3.endpoint", env.get("REST_S3_ENDPOINT"));
        props.put("s3.path-style-access", "true");
        props.put("s3.access-key-id", env.get("REST_S3_ACCESS_KEY"));
        props.put("s3.secret-access-key", env.get("REST_S3_SECRET_KEY"));
        props.put("client.region", "us-east-1");
      }
      JdbcCatalog made = new JdbcCatalog();
      made.setConf(new org.apache.hadoop.conf.Configuration());
      made.initialize(n, props);
      return made;
    });
  }

  private static Answer route(HttpExchange ex, String method, String path) throws IOException {
    if (path.equals("/v1/oauth/tokens") && method.equals("POST")) {
      return token(new String(ex.getRequestBody().readAllBytes(), StandardCharsets.UTF_8));
    }
    if (path.startsWith("/test/")) {
      return testRoute(ex, path);
    }
    if (path.equals("/v1/config")) {
      String asked = query(ex).getOrDefault("warehouse", "default");
      String name = asked.replaceAll("[^A-Za-z0-9_-]", "_");
      if (asked.startsWith("s3://")) {
        LOCATIONS.put(name, asked);
      }
      return new Answer(200, ConfigResponse.builder().withOverride("prefix", name).withEndpoints(ENDPOINTS).build());
    }
    authorize(ex.getRequestHeaders().getFirst("Authorization"));
    String[] all = path.substring(1).split("/");
    if (all.length < 3 || !all[0].equals("v1")) {
      return new Answer(404, ErrorResponse.builder().responseCode(404).withType("NoSuchRouteException")
          .withMessage("no route " + method + " " + path).build());
    }
    JdbcCatalog catalog = catalog(all[1]);
    String[] parts = new String[all.length - 1]; // the path without its prefix: v1, namespaces, ...
    parts[0] = "v1";
    System.arraycopy(all, 2, parts, 1, all.length - 2);
    if (parts[1].equals("transactions") && parts.length == 3 && parts[2].equals("commit") && method.equals("POST")) {
      commitTransaction(catalog, read(ex, CommitTransactionRequest.class));
      return new Answer(204, null);
    }
    if (parts[1].equals("tables") && parts.length == 3 && parts[2].equals("rename")) {
      CatalogHandlers.renameTable(catalog, read(ex, RenameTableRequest.class));
      return new Answer(204, null);
    }
    if (!parts[1].equals("namespaces")) {
      return new Answer(404, null);
    }
    if (parts.length == 2) {
      if (method.equals("GET")) {
        String parent = query(ex).get("parent");
        Namespace ns = parent == null ? Namespace.empty() : Namespace.of(parent.split(SEP));
        return new Answer(200, CatalogHandlers.listNamespaces(catalog, ns));
      }
      return new Answer(200, CatalogHandlers.createNamespace(catalog, read(ex, CreateNamespaceRequest.class)));
    }
    Namespace ns = Namespace.of(URLDecoder.decode(parts[2], StandardCharsets.UTF_8).split(SEP));
    if (parts.length == 3) {
      switch (method) {
        case "HEAD":
          CatalogHandlers.namespaceExists(catalog, ns);
          return new Answer(204, null);
        case "DELETE":
          CatalogHandlers.dropNamespace(catalog, ns);
          return new Answer(204, null);
        default:
          return new Answer(200, CatalogHandlers.loadNamespace(catalog, ns));
      }
    }
    if (parts[3].equals("properties")) {
      return new Answer(200, CatalogHandlers.updateNamespaceProperties(
          catalog, ns, read(ex, UpdateNamespacePropertiesRequest.class)));
    }
    if (parts.length == 4) { // .../tables
      if (method.equals("GET")) {
        return new Answer(200, CatalogHandlers.listTables(catalog, ns));
      }
      return new Answer(200, CatalogHandlers.createTable(catalog, ns, read(ex, CreateTableRequest.class)));
    }
    TableIdentifier id = TableIdentifier.of(ns, URLDecoder.decode(parts[4], StandardCharsets.UTF_8));
    if (parts.length == 6 && parts[5].equals("metrics")) {
      return new Answer(204, null);
    }
    switch (method) {
      case "HEAD":
        CatalogHandlers.tableExists(catalog, id);
        return new Answer(204, null);
      case "DELETE":
        if ("true".equals(query(ex).get("purgeRequested"))) {
          CatalogHandlers.purgeTable(catalog, id);
        } else {
          CatalogHandlers.dropTable(catalog, id);
        }
        return new Answer(204, null);
      case "POST":
        UpdateTableRequest update = read(ex, UpdateTableRequest.class);
        refuseForTheTest(id.toString());
        synchronized (COMMIT_LOCK) {
          return new Answer(200, CatalogHandlers.updateTable(catalog, id, update));
        }
      default:
        return new Answer(200, CatalogHandlers.loadTable(catalog, id, RESTCatalogProperties.SnapshotMode.ALL));
    }
  }

  /** REST_FAIL_COMMITS and /test/fail-commits: refuse this commit as a concurrent writer's win would. */
  private static void refuseForTheTest(String what) {
    if (FAIL_COMMITS.getAndUpdate(n -> Math.max(0, n - 1)) > 0) {
      STATS.computeIfAbsent("refused commits", k -> new AtomicLong()).incrementAndGet();
      throw new CommitFailedException("Commit refused for the test (a concurrent commit won): %s", what);
    }
  }

  /** Every table's requirements checked, then every table's updates applied, under the commit lock. */
  private static void commitTransaction(JdbcCatalog catalog, CommitTransactionRequest request) {
    refuseForTheTest("a transaction of " + request.tableChanges().size() + " tables");
    synchronized (COMMIT_LOCK) {
      List<TableOperations> ops = new ArrayList<>();
      List<TableMetadata> bases = new ArrayList<>();
      List<TableMetadata> updated = new ArrayList<>();
      for (UpdateTableRequest change : request.tableChanges()) {
        TableOperations op = ((BaseTable) catalog.loadTable(change.identifier())).operations();
        TableMetadata base = op.refresh();
        for (UpdateRequirement requirement : change.requirements()) {
          requirement.validate(base); // CommitFailedException: another writer moved the table (409)
        }
        TableMetadata.Builder builder = TableMetadata.buildFrom(base);
        for (MetadataUpdate update : change.updates()) {
          update.applyTo(builder);
        }
        ops.add(op);
        bases.add(base);
        updated.add(builder.build());
      }
      long hold = HOLD_TRANSACTION_MS.getAndSet(0);
      if (hold > 0) {
        try {
          Thread.sleep(hold);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
      for (int i = 0; i < ops.size(); i++) {
        ops.get(i).commit(bases.get(i), updated.get(i));
      }
      STATS.computeIfAbsent("transactions committed", k -> new AtomicLong()).incrementAndGet();
    }
  }

  private static Answer testRoute(HttpExchange ex, String path) {
    if (path.equals("/test/expire")) {
      long cutoff = System.currentTimeMillis() - Long.parseLong(query(ex).getOrDefault("max-age-ms", "0"));
      long expired = 0;
      for (JdbcCatalog c : CATALOGS.values()) {
        for (Namespace ns : c.listNamespaces()) {
          for (TableIdentifier id : c.listTables(ns)) {
            org.apache.iceberg.Table table = c.loadTable(id);
            long before = java.util.stream.StreamSupport.stream(table.snapshots().spliterator(), false).count();
            table.expireSnapshots().expireOlderThan(cutoff).retainLast(1).commit();
            table.refresh();
            expired += before - java.util.stream.StreamSupport.stream(table.snapshots().spliterator(), false).count();
          }
        }
      }
      return new Answer(200, Map.of("expired", expired));
    }
    if (path.equals("/test/hold-transactions")) {
      HOLD_TRANSACTION_MS.set(Long.parseLong(query(ex).getOrDefault("ms", "0")));
      return new Answer(204, null);
    }
    if (path.equals("/test/fail-commits")) {
      FAIL_COMMITS.set(Integer.parseInt(query(ex).getOrDefault("n", "1")));
      return new Answer(204, null);
    }
    Map<String, Long> counts = new HashMap<>();
    STATS.forEach((k, v) -> counts.put(k, v.get()));
    counts.put("tokens issued", (long) TOKENS.size());
    return new Answer(200, counts);
  }

  private static Answer token(String form) {
    Map<String, String> f = RESTUtil.decodeFormData(form);
    if (clientId != null && !(clientId.equals(f.get("client_id")) && clientSecret.equals(f.get("client_secret")))) {
      Map<String, String> refused = Map.of("error", "invalid_client", "error_description", "unknown client or secret");
      return new Answer(401, refused);
    }
    String token = UUID.randomUUID().toString();
    TOKENS.put(token, System.currentTimeMillis() + tokenTtl * 1000L);
    return new Answer(200, OAuthTokenResponse.builder().withToken(token).withTokenType("bearer")
        .withIssuedTokenType("urn:ietf:params:oauth:token-type:access_token").setExpirationInSeconds(tokenTtl).build());
  }

  private static void authorize(String header) {
    if (clientId == null) {
      return;
    }
    String token = header != null && header.startsWith("Bearer ") ? header.substring(7) : "";
    Long until = TOKENS.get(token);
    if (until == null) {
      throw new NotAuthorizedException("Not authorized: no valid bearer token");
    }
    if (until < System.currentTimeMillis()) {
      STATS.computeIfAbsent("expired tokens refused", k -> new AtomicLong()).incrementAndGet();
      throw new NotAuthorizedException("Not authorized: the token expired");
    }
  }

  private static <T> T read(HttpExchange ex, Class<T> type) throws IOException {
    return MAPPER.readValue(ex.getRequestBody(), type);
  }

  private static Map<String, String> query(HttpExchange ex) {
    Map<String, String> out = new HashMap<>();
    String raw = ex.getRequestURI().getRawQuery();
    if (raw != null) {
      for (String kv : raw.split("&")) {
        int eq = kv.indexOf('=');
        if (eq > 0) {
          out.put(URLDecoder.decode(kv.substring(0, eq), StandardCharsets.UTF_8),
              URLDecoder.decode(kv.substring(eq + 1), StandardCharsets.UTF_8));
        }
      }
    }
    return out;
  }
}
