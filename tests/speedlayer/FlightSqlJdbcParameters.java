// Binds date and time parameters through the Arrow Flight SQL JDBC driver for
// tests/speedlayer/test_flight_sql_jdbc.py:
// java -cp flight-sql-jdbc-driver.jar FlightSqlJdbcParameters.java <jdbc url> <user> <password>
// Prints one tab-separated line per count: its label and the count the gateway answered, or
// "refused: " and the first line of the driver's error; then READ_* lines, values read back.
import java.sql.Connection;
import java.sql.Date;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.Properties;

public class FlightSqlJdbcParameters {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        properties.setProperty("user", args[1]);
        properties.setProperty("password", args[2]);
        try (Connection connection = DriverManager.getConnection(args[0], properties)) {
            // An instant against a TIMESTAMP (with time zone) column.
            try (PreparedStatement statement = connection.prepareStatement("SELECT count(*) FROM events WHERE ts >= ?")) {
                statement.setTimestamp(1, Timestamp.from(Instant.parse("2024-01-29T06:30:00Z")));
                print("TS", statement);
            }
            // A wall-clock time (JDBC's meaning of a Timestamp) against a TIMESTAMP_NTZ column.
            try (PreparedStatement statement = connection.prepareStatement("SELECT count(*) FROM events WHERE ts_ntz >= ?")) {
                statement.setTimestamp(1, Timestamp.valueOf("2024-01-29 06:30:00"));
                print("TS_NTZ", statement);
            }
            try (PreparedStatement statement = connection.prepareStatement("SELECT count(*) FROM events WHERE d >= ?")) {
                statement.setDate(1, Date.valueOf("2024-01-29"));
                print("DATE", statement);
            }
            // A string that is SQL text if pasted into the statement: bound, it is only a value.
            try (PreparedStatement statement = connection.prepareStatement(
                     "SELECT count(*) FROM orders WHERE day = ? OR day = ?")) {
                statement.setString(1, "2024-01-01' OR '1'='1");
                statement.setString(2, "2024-01-02");
                print("QUOTED", statement);
            }
            // Read back: the instant getTimestamp makes of a zoned TIMESTAMP (2024-01-01T07:00Z), and
            // the wall-clock text of a TIMESTAMP_NTZ (2024-01-01 07:00) and of a DATE, in this JVM's zone.
            try (PreparedStatement statement = connection.prepareStatement(
                     "SELECT ts, ts_ntz, d FROM events WHERE id = 7");
                 ResultSet rows = statement.executeQuery()) {
                rows.next();
                System.out.println("READ_TS\t" + rows.getTimestamp(1).toInstant());
                System.out.println("READ_TS_NTZ\t" + rows.getTimestamp(2));
                System.out.println("READ_DATE\t" + rows.getDate(3));
            }
        }
    }

    private static void print(String label, PreparedStatement statement) throws Exception {
        try (ResultSet rows = statement.executeQuery()) {
            while (rows.next()) {
                System.out.println(label + "\t" + rows.getLong(1));
            }
        } catch (Exception refused) {
            System.out.println(label + "\trefused: " + String.valueOf(refused.getMessage()).split("\n")[0]);
        }
    }
}
